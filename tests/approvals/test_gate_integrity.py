"""The rest of the gate's integrity (issue 29): standing approvals bound to the automation version,
four-eyes counting the last *definition* editor, re-runs that ask again past a gated step, and
retired signing keys that authorise nothing new."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval, StandingApproval
from approvals.services import ApprovalError, standing_approval_create
from audit import signing
from audit.models import AuditEvent
from automations.models import Automation, RunStatus
from automations.services import automation_update, run_rerun
from tests.factories import client_for, definition, http_step, risk_step, schedule, transform
from triggers.schedules import schedule_fire
from workspaces.models import Workspace

SIGN_OFF = {"step_id": "sign_off", "action": "require_approval", "config": {"message": "go on?"}}


def _grant(people, automation, **extra):
    fields = dict(workspace=people.workspace, automation_id=automation.pk, capability_id="http_request",
                  max_uses=5, expires_at=timezone.now() + timedelta(hours=1), user=people.alice)  # fmt: skip
    return standing_approval_create(**{**fields, **extra})


# --- standing approvals are bound to the version they were granted for ------------------------------


def test_an_edit_of_the_step_is_not_pre_approved_and_the_grant_says_void_since(
    drive, people, target, path_for
):
    first, edited = path_for("standing-v1"), path_for("standing-v2")
    automation = drive.automation(definition(risk_step("medium", target.url(first)), autonomy="A2"))
    standing = _grant(people, automation)
    assert drive.start(automation).status == RunStatus.SUCCEEDED  # version 1: covered

    # The operator points the step somewhere else: version 2.
    response = client_for(people.operator).patch(
        f"/api/v1/automations/{automation.pk}",
        {"definition": definition(risk_step("medium", target.url(edited)), autonomy="A2")}, format="json",
    )  # fmt: skip
    assert response.status_code == 200
    assert response.json()["version"] == 2
    run = drive.start(automation)

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert target.count(edited) == 0
    standing.refresh_from_db()
    assert standing.uses == 1
    listed = client_for(people.alice).get("/api/v1/standing-approvals").json()["results"]
    shown = next(row for row in listed if row["id"] == str(standing.pk))
    assert (shown["automation_version"], shown["void_since_version"]) == (1, 2)
    assert shown["state"] == "void since version 2"


def test_the_admin_shows_a_voided_standing_approval(drive, people, target, path_for):
    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("sa-admin"))), autonomy="A2")
    )
    _grant(people, automation)
    automation_update(automation=automation, user=people.owner,
                      definition=definition(risk_step("medium", target.url(path_for("sa-admin2"))), autonomy="A2"))  # fmt: skip
    people.owner.is_staff = people.owner.is_superuser = True
    people.owner.save()
    from django.test import Client

    admin = Client()
    admin.force_login(people.owner)
    page = admin.get(reverse("admin:approvals_standingapproval_changelist"))

    assert page.status_code == 200
    assert b"void since version 2" in page.content


def test_the_signature_covers_the_version_binding(drive, people, target, path_for):
    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("sa-rebind"))), autonomy="A2")
    )
    standing = _grant(people, automation)
    automation_update(automation=automation, user=people.owner,
                      definition=definition(risk_step("medium", target.url(path_for("sa-rebind2"))), autonomy="A2"))  # fmt: skip
    # Re-binding the row to the new version in the database breaks its signature.
    StandingApproval.objects.filter(pk=standing.pk).update(automation_version=2)

    run = drive.start(Automation.objects.get(pk=automation.pk))

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert StandingApproval.objects.get(pk=standing.pk).uses == 0
    assert AuditEvent.objects.filter(type="approval.standing.rejected").count() == 1


def test_a_run_of_the_granted_version_is_still_covered_after_an_unrelated_save_is_undone(
    drive, people, target, path_for
):
    path = path_for("sa-same")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    _grant(people, automation)
    # A PATCH that changes nothing makes no new version: still covered.
    client_for(people.operator).patch(f"/api/v1/automations/{automation.pk}",
                                      {"definition": automation.definition}, format="json")  # fmt: skip

    assert drive.start(automation).status == RunStatus.SUCCEEDED


# --- four-eyes: the last *definition* editor -----------------------------------------------------


@pytest.fixture
def four_eyes(people):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)


def test_pausing_and_resuming_makes_nobody_the_last_editor(drive, people, target, path_for, four_eyes):
    # given: the owner (an admin, who may also approve) wrote a scheduled automation
    doc = {**definition(risk_step("medium", target.url(path_for("four-eyes-toggle"))), autonomy="A2"),
           "triggers": [schedule(cron="* * * * *")]}  # fmt: skip
    automation = drive.automation(doc, user=people.owner)
    operator = client_for(people.operator)
    # when: the operator pauses and resumes it, and the schedule fires
    for status in ("paused", "active"):
        assert operator.patch(f"/api/v1/automations/{automation.pk}", {"status": status},
                              format="json").status_code == 200  # fmt: skip
    assert Automation.objects.get(pk=automation.pk).updated_by_id == people.owner.pk
    next_minute = (timezone.now() + timedelta(minutes=1)).replace(second=1, microsecond=0)
    fired = schedule_fire(trigger_id=automation.triggers.get().pk, now=next_minute)
    run = drive(fired.run_ids[0])
    approval = drive.approval(run)

    # then: the owner still last edited the definition and cannot approve its steps
    assert approval.last_editor_id == people.owner.pk
    with pytest.raises(ApprovalError) as refused:
        drive.decide(approval, people.owner)
    assert refused.value.code == "PERMISSION_DENIED"
    assert people.operator.pk not in (approval.principal_ids or [])
    drive.decide(approval, people.alice)
    assert drive.resume(run).status == RunStatus.SUCCEEDED


def test_a_definition_edit_still_makes_its_editor_the_last_editor(drive, people, target, path_for, four_eyes):
    automation = drive.automation(definition(risk_step("medium", target.url(path_for("fe-edit"))), autonomy="A2"),
                                  user=people.operator)  # fmt: skip
    automation_update(
        automation=automation, user=people.owner, definition={**automation.definition, "name": "v2"}
    )

    run = drive.start(automation, user=people.operator)

    assert drive.approval(run).last_editor_id == people.owner.pk
    with pytest.raises(ApprovalError):
        drive.decide(drive.approval(run), people.owner)


# --- re-runs ask again past a gated step ----------------------------------------------------------


def test_a_rerun_from_after_a_require_approval_step_asks_again(drive, people, target, path_for):
    path = path_for("rerun-sign-off")
    automation = drive.automation(definition(SIGN_OFF, risk_step("medium", target.url(path))))
    run = drive.start(automation)
    drive.decide(drive.approval(run), people.alice)
    assert drive.resume(run).status == RunStatus.SUCCEEDED
    assert target.count(path) == 1

    again = drive(run_rerun(run=run, user=people.operator, from_step="create_item").pk)

    assert again.status == RunStatus.AWAITING_APPROVAL
    assert target.count(path) == 1
    approval = drive.approval(again)
    assert approval.step_id == "sign_off"
    assert "re-run" in approval.why
    drive.decide(approval, people.bob)
    again = drive.resume(again)
    assert again.status == RunStatus.SUCCEEDED
    assert target.count(path) == 2
    assert drive.step(again, "sign_off").status == "succeeded"  # asked again, not run again


def test_a_rerun_past_a_gated_step_asks_again_and_never_repeats_it(drive, people, target, path_for):
    erase, after = path_for("rerun-erase"), path_for("rerun-after")
    automation = drive.automation(definition(risk_step("high", target.url(erase)),
                                             http_step("notify", target.url(after), "POST")))  # fmt: skip
    run = drive.start(automation)
    drive.decide(drive.approval(run), people.alice)
    assert drive.resume(run).status == RunStatus.SUCCEEDED

    again = drive(run_rerun(run=run, user=people.operator, from_step="notify").pk)
    assert again.status == RunStatus.AWAITING_APPROVAL
    drive.decide(drive.approval(again), people.alice, decision="deny", reason="not again")
    again = drive.resume(again)

    assert (again.status, again.error["code"]) == (RunStatus.FAILED, "APPROVAL_DENIED")
    assert (target.count(erase), target.count(after)) == (1, 1)


def test_a_rerun_past_ungated_steps_does_not_ask(drive, people, target, path_for):
    path = path_for("rerun-plain")
    automation = drive.automation(
        definition(transform("prepare", {"n": 1}), risk_step("medium", target.url(path)))
    )
    run = drive.start(automation)

    again = drive(run_rerun(run=run, user=people.operator, from_step="create_item").pk)

    assert again.status == RunStatus.SUCCEEDED
    assert not Approval.objects.exists()
    assert target.count(path) == 2


# --- retired keys verify old signatures, authorise nothing new ------------------------------------


def _rotate() -> None:
    call_command("keygen", "--rotate", stdout=io.StringIO(), stderr=io.StringIO())


def test_an_approval_token_signed_by_a_retired_key_is_refused(drive, people, target, path_for):
    path = path_for("retired-token")
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")))
    drive.decide(drive.approval(run), people.alice)  # the token is signed now ...
    old_key = signing.current_key_id()
    checkpoint_key, checkpoint = signing.sign(b"an old checkpoint")
    _rotate()  # ... and the key retires before the executor uses it

    run = drive.resume(run)

    assert (run.status, run.error["code"]) == (RunStatus.FAILED, "APPROVAL_INVALID")
    assert target.count(path) == 0
    rejected = AuditEvent.objects.get(type="approval.token_rejected")
    assert rejected.payload["reason"] == "retired_key"
    # The retired key still proves what it signed before the rotation.
    assert signing.current_key_id() != old_key
    assert signing.verify(checkpoint_key, b"an old checkpoint", checkpoint)


def test_a_standing_approval_signed_by_a_retired_key_covers_nothing(drive, people, target, path_for):
    path = path_for("retired-standing")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    standing = _grant(people, automation)
    _rotate()

    run = drive.start(automation)

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert target.count(path) == 0
    rejected = AuditEvent.objects.get(type="approval.standing.rejected")
    assert (rejected.payload["code"], rejected.payload["reason"]) == ("APPROVAL_INVALID", "retired_key")
    listed = client_for(people.alice).get("/api/v1/standing-approvals").json()["results"]
    assert next(r for r in listed if r["id"] == str(standing.pk))["state"] == "void: signed by a retired key"
