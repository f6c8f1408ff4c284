"""Standing approvals: within bounds a step runs without asking (and counts a use); outside them it asks."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from approvals.gate import standing_signature_valid
from approvals.models import Approval, StandingApproval
from approvals.services import ApprovalError, standing_approval_create, standing_approval_revoke
from audit.models import AuditEvent
from tests.factories import definition, risk_step


@pytest.fixture
def setup(drive, people, target, path_for):
    path = path_for("standing")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))

    def grant(**overrides):
        fields = dict(workspace=people.workspace, automation_id=automation.pk, capability_id="http_request",
                      max_uses=2, expires_at=timezone.now() + timedelta(hours=1), user=people.alice,
                      arg_constraint={"type": "object", "properties": {"url": {"pattern": "/standing-"}}})  # fmt: skip
        return standing_approval_create(**{**fields, **overrides})

    return SimpleNamespace(path=path, automation=automation, grant=grant)


def test_within_bounds_runs_without_asking_and_counts_uses(drive, target, setup):
    standing = setup.grant(max_uses=2)

    first, second = drive.start(setup.automation), drive.start(setup.automation)

    assert (first.status, second.status) == ("succeeded", "succeeded")
    assert target.count(setup.path) == 2
    assert not Approval.objects.exists()
    standing.refresh_from_db()
    assert standing.uses == 2
    assert AuditEvent.objects.filter(type="approval.standing.used").count() == 2


def test_beyond_max_uses_asks(drive, target, setup):
    setup.grant(max_uses=1)
    assert drive.start(setup.automation).status == "succeeded"

    run = drive.start(setup.automation)

    assert run.status == "awaiting_approval"
    assert target.count(setup.path) == 1
    assert StandingApproval.objects.get().uses == 1


def test_expired_standing_approval_asks(drive, target, setup, monkeypatch):
    from approvals import gate

    standing = setup.grant()
    # Moving the expiry by a database edit would break the signature; let time pass instead.
    later = standing.expires_at + timedelta(seconds=1)
    monkeypatch.setattr(gate, "timezone", SimpleNamespace(now=lambda: later))

    run = drive.start(setup.automation)

    assert run.status == "awaiting_approval"
    assert target.count(setup.path) == 0


def test_arg_constraint_violated_asks(drive, target, path_for, people, setup):
    setup.grant(arg_constraint={"type": "object", "properties": {"url": {"pattern": "/somewhere-else$"}}})

    run = drive.start(setup.automation)

    assert run.status == "awaiting_approval"
    assert StandingApproval.objects.get().uses == 0


def test_other_automation_or_capability_is_not_covered(drive, target, path_for, setup):
    setup.grant(capability_id="send_email")
    other = drive.automation(
        definition(risk_step("medium", target.url(path_for("standing-other"))), name="other", autonomy="A2")
    )

    assert drive.start(setup.automation).status == "awaiting_approval"
    assert drive.start(other).status == "awaiting_approval"


def test_revoked_standing_approval_asks(drive, people, setup):
    standing = setup.grant()
    standing_approval_revoke(standing_id=standing.pk, user=people.bob)

    assert drive.start(setup.automation).status == "awaiting_approval"
    assert AuditEvent.objects.filter(type="approval.standing.revoked").count() == 1


@pytest.mark.parametrize("edit", [{"max_uses": 1000}, {"arg_constraint": None}])
def test_bounds_widened_in_the_database_break_the_signature(drive, target, setup, edit):
    standing = setup.grant()
    StandingApproval.objects.filter(pk=standing.pk).update(**edit)
    standing.refresh_from_db()
    assert not standing_signature_valid(standing)

    run = drive.start(setup.automation)

    assert run.status == "awaiting_approval"
    assert target.count(setup.path) == 0
    assert StandingApproval.objects.get().uses == 0
    assert AuditEvent.objects.filter(type="approval.standing.rejected").count() == 1


def test_expiry_pushed_out_in_the_database_breaks_the_signature(drive, setup):
    standing = setup.grant()
    StandingApproval.objects.filter(pk=standing.pk).update(
        expires_at=standing.expires_at + timedelta(days=300)
    )

    assert drive.start(setup.automation).status == "awaiting_approval"


def test_standing_approval_never_covers_an_explicit_require_approval_step(drive, people):
    step = {"step_id": "sign_off", "action": "require_approval", "config": {"message": "ok?"}}
    automation = drive.automation(definition(step, autonomy="A4"))
    standing_approval_create(workspace=people.workspace, automation_id=automation.pk, capability_id="require_approval",
                             max_uses=5, expires_at=timezone.now() + timedelta(hours=1), user=people.alice)  # fmt: skip

    assert drive.start(automation).status == "awaiting_approval"


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"user": "operator"}, "PERMISSION_DENIED"),
        ({"max_uses": 0}, "INVALID_ARGUMENT"),
        ({"expires_at": "past"}, "INVALID_ARGUMENT"),
        ({"arg_constraint": {"type": "no-such-type"}}, "INVALID_ARGUMENT"),
        ({"automation_id": "not-a-uuid"}, "INVALID_ARGUMENT"),
    ],
)
def test_creating_a_standing_approval_checks_its_bounds(people, setup, overrides, code):
    if overrides.get("user"):
        overrides["user"] = getattr(people, overrides["user"])
    if overrides.get("expires_at") == "past":
        overrides["expires_at"] = timezone.now() - timedelta(seconds=1)

    with pytest.raises(ApprovalError) as refused:
        setup.grant(**overrides)

    assert refused.value.code == code
    assert not StandingApproval.objects.exists()


def test_standing_approval_for_call_capability_constrains_args_under_what(drive, people, target, path_for):
    """``arg_constraint`` applies to the whole rendered config; for http_request that is method/url/…"""
    path = path_for("standing-post")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    standing_approval_create(
        workspace=people.workspace, automation_id=automation.pk, capability_id="http_request", max_uses=1,
        expires_at=timezone.now() + timedelta(hours=1), user=people.alice,
        arg_constraint={"type": "object", "required": ["method"], "properties": {"method": {"const": "GET"}}},
    )  # fmt: skip

    assert drive.start(automation).status == "awaiting_approval"


def test_standing_approval_granted_while_a_step_waits_takes_its_request_off_the_queue(drive, target, setup):
    run = drive.start(setup.automation)
    waiting = drive.approval(run)
    setup.grant()

    run = drive.resume(run)  # the run comes back to the gate (e.g. the sweep re-sent resume_run)

    assert run.status == "succeeded"
    assert target.count(setup.path) == 1
    assert Approval.objects.get(pk=waiting.pk).status == "invalidated"
