"""Forged, copied, replayed, stale and tampered approvals never run a step, and are audited."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.utils import timezone

from approvals import gate, tokens
from approvals.models import Approval, ApprovalStatus, ConsumedNonce
from audit import signing
from audit.models import AuditEvent
from automations.models import Run, StepRun
from tests.factories import audit_types, definition, http_step, risk_step


def _rejection(run) -> dict:
    event = AuditEvent.objects.filter(trace_id=run.trace_id, type="approval.token_rejected").get()
    return event.payload


def _assert_refused(drive, run, target, path, code="POLICY_VIOLATION"):
    assert run.status == "failed"
    assert run.error["code"] == code
    assert target.count(path) == 0


@pytest.fixture
def parked(drive, target, path_for):
    """A run waiting for approval of one high-risk step."""
    path = path_for("forgery")
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")))
    assert run.status == "awaiting_approval"
    return SimpleNamespace(run=run, path=path, approval=drive.approval(run))


@pytest.mark.parametrize("token", ["", "garbage", "e30.e30"])
def test_row_flipped_to_approved_without_a_valid_token_does_not_run(drive, target, parked, token):
    Approval.objects.filter(pk=parked.approval.pk).update(status="approved", token=token)

    run = drive.resume(parked.run)

    _assert_refused(drive, run, target, parked.path)
    assert _rejection(run)["reason"] == "malformed"
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.INVALIDATED
    assert not ConsumedNonce.objects.exists()


def test_token_signed_with_another_key_does_not_run(drive, people, target, parked):
    approval = drive.decide(parked.approval, people.alice)
    payload = json.loads(signing.b64url_decode(approval.token.split(".")[0]))
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    forged = f"{signing.b64url(data)}.{signing.b64url(Ed25519PrivateKey.generate().sign(data))}"
    Approval.objects.filter(pk=approval.pk).update(token=forged)

    run = drive.resume(parked.run)

    _assert_refused(drive, run, target, parked.path)
    assert _rejection(run)["reason"] == "bad_signature"


def test_token_from_a_key_the_platform_never_had_does_not_run(drive, people, target, parked):
    approval = drive.decide(parked.approval, people.alice)
    other = Ed25519PrivateKey.generate()
    payload = json.loads(signing.b64url_decode(approval.token.split(".")[0]))
    payload["kid"] = signing.key_id_for(other.public_key())
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    Approval.objects.filter(pk=approval.pk).update(
        token=f"{signing.b64url(data)}.{signing.b64url(other.sign(data))}"
    )

    run = drive.resume(parked.run)

    _assert_refused(drive, run, target, parked.path)
    assert _rejection(run)["reason"] == "unknown_key"


def test_token_copied_to_another_steps_approval_does_not_run(drive, people, target, path_for):
    first, second = path_for("first"), path_for("second")
    doc = definition(
        http_step("remove_a", target.url(first), "POST"),
        http_step("remove_b", target.url(second), "POST"),
        autonomy="A2",
    )
    run = drive.start(drive.automation(doc))
    token_a = drive.decide(drive.approval(run), people.alice).token
    run = drive.resume(run)
    assert target.count(first) == 1
    assert run.status == "awaiting_approval"
    approval_b = drive.approval(run)
    assert approval_b.step_id == "remove_b"

    Approval.objects.filter(pk=approval_b.pk).update(status="approved", token=token_a)
    run = drive.resume(run)

    _assert_refused(drive, run, target, second)
    assert _rejection(run)["reason"] == "approval_mismatch"
    assert target.count(first) == 1


def test_token_copied_to_another_runs_approval_does_not_run(drive, people, target, path_for):
    path = path_for("two-runs")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    run_1, run_2 = drive.start(automation), drive.start(automation)
    token_1 = drive.decide(drive.approval(run_1), people.alice).token

    Approval.objects.filter(pk=drive.approval(run_2).pk).update(status="approved", token=token_1)
    run_2 = drive.resume(run_2)

    _assert_refused(drive, run_2, target, path)
    assert _rejection(run_2)["reason"] == "approval_mismatch"


def test_approval_row_moved_to_another_step_is_refused_by_its_token(drive, people, target, parked):
    """Even with the approval id matching, a token is bound to its run and step."""
    approval = drive.decide(parked.approval, people.alice)
    Approval.objects.filter(pk=approval.pk).update(step_key="plan:0:other")
    # The row now claims another step, so this step has no approval: the gate asks again.
    run = drive.resume(parked.run)
    assert run.status == "awaiting_approval"
    assert target.count(parked.path) == 0
    request = gate.GateRequest(**{**_request(drive, run, approval), "step_key": "plan:0:other"})

    verdict = gate.check_step(request)

    assert verdict.status == "invalid"
    assert AuditEvent.objects.filter(type="approval.token_rejected", payload__reason="step_mismatch").exists()


def _request(drive, run, approval) -> dict:
    return dict(
        workspace_id=run.workspace_id, run_id=str(run.pk), automation_id=str(run.automation_id),
        automation_name=approval.automation_name, step_key=approval.step_key, step_id=approval.step_id,
        action=approval.action, capability_id=approval.capability_id, risk=approval.risk, reasons=[],
        what=approval.what, message="", plan_hash=approval.plan_hash, requested_by=approval.requested_by,
        last_editor_id=None, approvals_required=1, expires_in_seconds=3600, trace_id=run.trace_id,
    )  # fmt: skip


def test_replayed_consumed_token_does_not_run_again(drive, people, target, parked):
    approval = drive.decide(parked.approval, people.alice)
    run = drive.resume(parked.run)
    assert run.status == "succeeded"
    assert target.count(parked.path) == 1
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.CONSUMED

    # Put the run back in front of the step, and the spent approval back to "approved".
    Run.objects.filter(pk=run.pk).update(
        status="awaiting_approval", step_index=0, finished_at=None, output=None
    )
    StepRun.objects.filter(run=run).update(status="awaiting_approval")
    Approval.objects.filter(pk=approval.pk).update(status="approved")
    run = drive.resume(run)

    assert target.count(parked.path) == 1
    assert run.status == "failed"
    assert run.error["code"] == "POLICY_VIOLATION"
    assert "approval.replay_refused" in audit_types(run.trace_id)
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.INVALIDATED


def test_consumed_approval_is_never_reused_a_fresh_one_is_requested(drive, people, target, parked):
    """The worker died after consuming: the step asks again instead of running on the old token."""
    approval = drive.decide(parked.approval, people.alice)
    request = gate.GateRequest(**_request(drive, parked.run, approval))
    assert gate.check_step(request).status == "approved"

    again = gate.check_step(request)

    assert again.status == "pending"
    assert again.created
    assert again.approval_id != str(approval.pk)


def test_config_changed_after_approval_asks_again_and_does_not_run(drive, people, target, path_for):
    approved_path, other_path = path_for("approved"), path_for("swapped")
    doc = definition(
        {
            "step_id": "create_item",
            "action": "http_request",
            "config": {"method": "POST", "url": "{{ inputs.url }}"},
        },
        inputs_schema={"type": "object", "properties": {"url": {"type": "string"}}},
        autonomy="A2",
    )
    run = drive.start(drive.automation(doc), inputs={"url": target.url(approved_path)})
    old = drive.decide(drive.approval(run), people.alice)

    Run.objects.filter(pk=run.pk).update(inputs={"url": target.url(other_path)})
    run = drive.resume(run)

    assert run.status == "awaiting_approval"
    assert target.count(approved_path) == 0
    assert target.count(other_path) == 0
    assert Approval.objects.get(pk=old.pk).status == ApprovalStatus.INVALIDATED
    fresh = drive.approval(run)
    assert fresh.pk != old.pk
    assert fresh.status == ApprovalStatus.PENDING
    assert fresh.what["url"] == target.url(other_path)
    invalidated = AuditEvent.objects.get(trace_id=run.trace_id, type="approval.invalidated")
    assert invalidated.payload["reason"] == "plan_changed"


def test_config_changed_and_plan_hash_forged_on_the_row_is_refused_by_the_token(
    drive, people, target, path_for
):
    approved_path, other_path = path_for("approved"), path_for("swapped")
    doc = definition(
        {
            "step_id": "create_item",
            "action": "http_request",
            "config": {"method": "POST", "url": "{{ inputs.url }}"},
        },
        inputs_schema={"type": "object", "properties": {"url": {"type": "string"}}},
        autonomy="A2",
    )
    run = drive.start(drive.automation(doc), inputs={"url": target.url(approved_path)})
    approval = drive.decide(drive.approval(run), people.alice)
    Run.objects.filter(pk=run.pk).update(inputs={"url": target.url(other_path)})
    # The attacker also rewrites the row's plan hash to what will now be rendered.
    from automations.steps import plan_hash

    run.refresh_from_db()
    new_hash = plan_hash(run.snapshot, approval.step_key, {"method": "POST", "url": target.url(other_path)})
    Approval.objects.filter(pk=approval.pk).update(plan_hash=new_hash)

    run = drive.resume(run)

    _assert_refused(drive, run, target, other_path)
    assert _rejection(run)["reason"] == "plan_hash_mismatch"


def test_expired_token_does_not_run(drive, people, target, parked, monkeypatch):
    approval = drive.decide(parked.approval, people.alice)
    exp = tokens.decode(approval.token)[1]["exp"]
    later = datetime.fromtimestamp(exp, tz=UTC) + timedelta(seconds=1)
    monkeypatch.setattr(gate, "timezone", SimpleNamespace(now=lambda: later))

    run = drive.resume(parked.run)

    _assert_refused(drive, run, target, parked.path, code="APPROVAL_EXPIRED")
    assert _rejection(run)["reason"] == "expired"
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.EXPIRED


def test_validly_signed_token_with_past_expiry_does_not_run(drive, people, target, parked):
    approval = drive.decide(parked.approval, people.alice)
    payload = tokens.decode(approval.token)[1]
    stale = tokens.mint(approval_id=payload["approval_id"], run_id=payload["run_id"], step_key=payload["step_key"],
                        plan_hash=payload["plan_hash"], nonce="n", exp=timezone.now() - timedelta(seconds=1))  # fmt: skip
    Approval.objects.filter(pk=approval.pk).update(token=stale)

    run = drive.resume(parked.run)

    _assert_refused(drive, run, target, parked.path, code="APPROVAL_EXPIRED")
    assert _rejection(run)["reason"] == "expired"
