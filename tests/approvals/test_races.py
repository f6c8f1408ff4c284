"""Races, with committed data and one database connection per thread.

On SQLite every write transaction starts with BEGIN IMMEDIATE, so writers queue;
on PostgreSQL the row lock (select_for_update) and the conditional UPDATEs
decide. Either way exactly one outcome may win.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from approvals import gate
from approvals.models import Approval, ApprovalDecision, ApprovalStatus, ConsumedNonce, StandingApproval
from approvals.services import ApprovalError, approval_decide, standing_approval_create
from automations.executor import execute_run
from automations.services import run_resume
from tests.factories import definition, risk_step

pytestmark = pytest.mark.django_db(transaction=True)  # threads: each has its own connection

ROUNDS = 4


def race(*calls: Callable[[], Any]) -> list[Any]:
    """Start every call at the same moment in its own thread; return results (or exceptions) in order."""
    barrier = threading.Barrier(len(calls))
    results: list[Any] = [None] * len(calls)

    def run(index: int, call: Callable[[], Any]) -> None:
        try:
            barrier.wait(timeout=10)
            results[index] = call()
        except Exception as exc:
            results[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def _parked(drive, target, path: str, **step_extra):
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path)) | step_extra, autonomy="A2"))
    )
    assert run.status == "awaiting_approval"
    return run, drive.approval(run)


@pytest.mark.parametrize("attempt", range(ROUNDS))
def test_approve_and_deny_at_the_same_moment_exactly_one_wins(drive, people, target, path_for,
                                                               attempt):  # fmt: skip
    run, approval = _parked(drive, target, path_for("race"))

    approve = lambda: approval_decide(approval_id=approval.pk, user=people.alice, decision="approve")  # noqa: E731
    deny = lambda: approval_decide(approval_id=approval.pk, user=people.bob, decision="deny", reason="no")  # noqa: E731
    results = race(approve, deny) if attempt % 2 == 0 else race(deny, approve)[::-1]

    winners = [r for r in results if isinstance(r, Approval)]
    losers = [r for r in results if isinstance(r, ApprovalError)]
    assert len(winners) == 1, results
    assert len(losers) == 1, results
    assert losers[0].code == "CONFLICT"
    final = Approval.objects.get(pk=approval.pk)
    assert final.status == winners[0].status
    assert final.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED)
    assert bool(final.token) == (final.status == ApprovalStatus.APPROVED)
    assert ApprovalDecision.objects.filter(approval=approval).count() == 1


@pytest.mark.parametrize("attempt", range(ROUNDS))
def test_two_executors_resuming_the_same_approved_step_perform_it_once(drive, people, target,
                                                                      path_for, attempt):  # fmt: skip
    path = path_for("resume-race")
    run, approval = _parked(drive, target, path)
    approval_decide(approval_id=approval.pk, user=people.alice, decision="approve")
    run_resume(run_id=str(run.pk))

    race(lambda: execute_run(str(run.pk), me="worker-a:1"), lambda: execute_run(str(run.pk), me="worker-b:2"))

    run.refresh_from_db()
    assert run.status == "succeeded", run.error
    assert target.count(path) == 1
    assert ConsumedNonce.objects.filter(approval_id=approval.pk).count() == 1


@pytest.mark.parametrize("attempt", range(ROUNDS))
def test_two_gate_checks_of_one_approved_token_approve_once(drive, people, target, path_for,
                                                            attempt):  # fmt: skip
    """Below the run claim: even two executors that both reached the gate get one approval between them."""
    run, approval = _parked(drive, target, path_for("gate-race"))
    approval = approval_decide(approval_id=approval.pk, user=people.alice, decision="approve")
    request = gate.GateRequest(
        workspace_id=run.workspace_id, run_id=str(run.pk), automation_id=str(run.automation_id),
        automation_name=approval.automation_name, step_key=approval.step_key, step_id=approval.step_id,
        action=approval.action, capability_id=approval.capability_id, risk=approval.risk, reasons=[],
        what=approval.what, message="", plan_hash=approval.plan_hash, requested_by=approval.requested_by,
        last_editor_id=None, approvals_required=1, expires_in_seconds=3600, trace_id=run.trace_id,
    )  # fmt: skip

    verdicts = race(lambda: gate.check_step(request), lambda: gate.check_step(request))

    statuses = sorted(v.status for v in verdicts)
    assert statuses == ["approved", "pending"], verdicts
    assert ConsumedNonce.objects.filter(approval_id=approval.pk).count() == 1


def test_concurrent_runs_cannot_overspend_a_standing_approval(drive, people, target, path_for):
    path = path_for("standing-race")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    standing_approval_create(workspace=people.workspace, automation_id=automation.pk,
                             capability_id="http_request", max_uses=1, user=people.alice,
                             expires_at=timezone.now() + timedelta(hours=1))  # fmt: skip

    runs = race(*[lambda: drive.start(automation) for _ in range(3)])

    assert sorted(r.status for r in runs) == ["awaiting_approval", "awaiting_approval", "succeeded"], runs
    assert target.count(path) == 1
    assert StandingApproval.objects.get().uses == 1
