"""The concurrency policy (SPEC §7.1), decided in one place.

``execution.concurrency`` is ``allow_parallel`` (no limit unless
``max_concurrent`` is set), ``queue`` (hold new runs while ``max_concurrent``,
default 1, are active) or ``drop_if_running`` (suppress them instead). Runs are
counted per ``(automation, concurrency_key)``.

Both sides of the limit go through here under the same lock: the dispatcher
asks :func:`admit` whether a new run starts, is held or is dropped; a run that
stops being active calls :func:`run_settled` to start the runs held behind it.
The lock is ``FOR NO KEY UPDATE`` on the automation row: it serialises
admissions and releases without blocking the foreign-key checks of
transactions inserting that automation's runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from .enqueue import run_enqueue
from .models import ACTIVE_RUN_STATUSES, Automation, Run, RunStatus


class Admission(enum.StrEnum):
    START = "start"
    HOLD = "hold"  # queued, not sent, until an active run settles
    DROP = "drop"  # drop_if_running: suppressed


@dataclass(frozen=True)
class Limit:
    policy: str
    max_concurrent: int | None  # None: no limit, nothing to count or lock

    @classmethod
    def of(cls, snapshot: dict[str, Any]) -> Limit:
        execution = snapshot.get("execution") or {}
        policy = execution.get("concurrency", "allow_parallel")
        default = None if policy == "allow_parallel" else 1
        return cls(policy, execution.get("max_concurrent", default))


def lock_automation(automation_id: Any) -> Automation | None:
    return Automation.objects.select_for_update(no_key=True).filter(pk=automation_id).first()


def needs_lock(automation: Automation) -> bool:
    """Whether :func:`admit` takes the automation's row lock (and reads) for a new run of it."""
    return Limit.of(automation.definition).max_concurrent is not None


def admit(automation: Automation, concurrency_key: str) -> tuple[Admission, Automation]:
    """May a new run of ``automation`` start now? Call inside the transaction that creates it.

    Returns the decision and the automation row as read under the lock (its
    definition may have changed since the caller read it).
    """
    limit = Limit.of(automation.definition)
    if limit.max_concurrent is None:
        return Admission.START, automation
    automation = lock_automation(automation.pk) or automation
    limit = Limit.of(automation.definition)
    if limit.max_concurrent is None:
        return Admission.START, automation
    active = Run.objects.filter(
        automation=automation, concurrency_key=concurrency_key, status__in=ACTIVE_RUN_STATUSES
    )
    if active.count() < limit.max_concurrent and not active.filter(enqueued_at__isnull=True).exists():
        return Admission.START, automation
    return (Admission.DROP if limit.policy == "drop_if_running" else Admission.HOLD), automation


def run_settled(run: Run) -> None:
    """``run`` stopped being active: send the runs held behind it that now fit."""
    limit = Limit.of(run.snapshot)
    if limit.max_concurrent is None:
        return
    with transaction.atomic():
        if lock_automation(run.automation_id) is None:
            return
        same = Run.objects.filter(automation_id=run.automation_id, concurrency_key=run.concurrency_key)
        active = same.filter(status__in=ACTIVE_RUN_STATUSES, enqueued_at__isnull=False).count()
        free = limit.max_concurrent - active
        if free <= 0:
            return
        held = list(
            same.filter(status=RunStatus.QUEUED, enqueued_at__isnull=True).order_by("created_at")[:free]
        )
        for next_run in held:
            Run.objects.filter(pk=next_run.pk).update(enqueued_at=timezone.now())
            run_enqueue(next_run)
