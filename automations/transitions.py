"""The run state machine: every status change goes through ``check_transition``, and is
logged once, at INFO, by :func:`log_change` (logger ``autoplane.runs``)."""

from __future__ import annotations

import logging
from typing import Any

from django.utils import timezone

from .models import RunStatus, StepRun, StepStatus

logger = logging.getLogger("autoplane.runs")

S = RunStatus
ALLOWED: dict[str, frozenset[str]] = {
    S.QUEUED: frozenset({S.RUNNING, S.CANCELLED}),
    S.RUNNING: frozenset(
        {
            S.RUNNING,
            S.SUCCEEDED,
            S.FAILED,
            S.CANCELLED,
            S.TIMED_OUT,
            S.NEEDS_ATTENTION,
            S.AWAITING_APPROVAL,
            S.WAITING,
        }
    ),  # fmt: skip
    S.AWAITING_APPROVAL: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.WAITING: frozenset({S.RUNNING, S.QUEUED, S.CANCELLED}),
    S.NEEDS_ATTENTION: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
    S.TIMED_OUT: frozenset(),
}


class IllegalTransition(Exception):
    pass


def check_transition(current: str, new: str) -> None:
    if new == current and current == S.RUNNING:
        return
    if new not in ALLOWED.get(current, frozenset()):
        raise IllegalTransition(f"a run cannot go from {current} to {new}")


def sources_for(new: str) -> list[str]:
    """Statuses from which ``new`` may be reached (for conditional updates)."""
    return [status for status, targets in ALLOWED.items() if new in targets]


def log_change(run_id: Any, new: str, *, old: str | None = None, detail: str = "") -> None:
    """The one log line of a run's state change, e.g. ``run 5f0c… running -> succeeded``.

    Written right after the change is made, not on commit: no callback on the fire
    path. A change whose transaction then fails is rare (the ledger, not the log, is
    the record) and is followed by that failure's own ERROR line.
    """
    if logger.isEnabledFor(logging.INFO):
        change = f"{old} -> {new}" if old and old != new else new
        logger.info("run %s %s%s", run_id, change, f": {detail}" if detail else "")


def skip_unreached(run, status: str, reached: set[int] | None = None) -> None:
    """Plan steps a failed, timed-out or cancelled run never reached are ``skipped``
    (``reached``: the plan indices that have a step row, read from the database if not given)."""
    if reached is None:
        reached = set(StepRun.objects.filter(run=run, phase="plan").values_list("index", flat=True))
    now = timezone.now()
    StepRun.objects.bulk_create([
        StepRun(run=run, phase="plan", index=i, step_id=s["step_id"], action=s["action"],
                status=StepStatus.SKIPPED, error_message=f"not run: the run {status} before this step",
                started_at=now, finished_at=now)
        for i, s in enumerate(run.snapshot["plan"]) if i not in reached
    ])  # fmt: skip
