"""The run state machine: every status change goes through ``check_transition``."""

from __future__ import annotations

from .models import RunStatus

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
