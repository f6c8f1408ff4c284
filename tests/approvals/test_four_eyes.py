"""Four-eyes holds whatever started the run (issue 12, finding 2).

Under four-eyes, the people behind a run cannot approve it: who ran it, who published the
event that started it (along an event chain too), who rotated or owns the webhook token that
fired it; nor can the automation's last editor. A standing approval is a decision made in
advance, so it needs a second person too; and it names an automation of its own workspace.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from approvals.models import ApprovalStatus, StandingApproval
from approvals.services import ApprovalError, standing_approval_create
from automations import events
from automations.executor import execute_run
from automations.models import Run
from tests.factories import audit_types, definition, risk_step
from triggers.services import trigger_token_rotate
from workspaces.models import Workspace


@pytest.fixture
def four_eyes(people):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    people.workspace.refresh_from_db()


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def refused(drive, approval, user) -> ApprovalError:
    with pytest.raises(ApprovalError) as info:
        drive.decide(approval, user)
    return info.value


def executed(run_id) -> Run:
    execute_run(str(run_id))
    return Run.objects.get(pk=run_id)


def gated(target, path_for, **extra) -> dict:
    return definition(risk_step("medium", target.url(path_for("four-eyes"))), **extra, autonomy="A2")


def test_the_admin_who_fired_a_webhook_cannot_approve_its_run(drive, people, target, path_for, four_eyes):
    # given: operator wrote the automation; owner, an admin, rotated its webhook token in
    doc = {**gated(target, path_for), "triggers": [{"key": "hook", "type": "webhook"}]}
    automation = drive.automation(doc, user=people.operator)
    token = trigger_token_rotate(trigger=automation.triggers.get(), user=people.owner)
    # when: the token fires it
    fired = APIClient().post(f"/api/v1/automations/{automation.pk}/fire", {}, format="json",
                             HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    assert fired.status_code == 202, fired.content
    run = executed(fired.json()["run_id"])
    # then
    assert run.status == "awaiting_approval"
    assert run.triggered_by == "webhook:hook"
    assert set(run.principal_ids) == {people.owner.pk, people.operator.pk}
    error = refused(drive, drive.approval(run), people.owner)
    assert (error.code, error.http_status) == ("PERMISSION_DENIED", 403)
    assert "four-eyes" in error.message
    assert drive.decide(drive.approval(run), people.alice).status == ApprovalStatus.APPROVED


def test_the_user_who_published_an_event_cannot_approve_the_run_it_started(
    drive, people, target, path_for, four_eyes
):
    # given: an automation on "deploy.requested", written by operator
    doc = {**gated(target, path_for),
           "triggers": [{"key": "on", "type": "event", "config": {"event_type": "deploy.requested"}}]}  # fmt: skip
    automation = drive.automation(doc, user=people.operator)
    # when: owner publishes the event through the API, and it is delivered
    published = client_for(people.owner).post("/api/v1/events", {"event_type": "deploy.requested", "payload": {},
                                                                "workspace": "acme"}, format="json")  # fmt: skip
    assert published.status_code == 202, published.content
    events.deliver(published.json()["event_id"])
    run = executed(Run.objects.get(automation=automation).pk)
    # then
    assert run.status == "awaiting_approval"
    assert people.owner.pk in run.principal_ids
    assert refused(drive, drive.approval(run), people.owner).http_status == 403
    assert drive.decide(drive.approval(run), people.bob).status == ApprovalStatus.APPROVED


def test_the_originator_of_an_event_chain_cannot_approve_a_run_down_the_chain(
    drive, people, target, path_for, four_eyes
):
    # given: owner runs an automation whose step emits an event another automation subscribes to
    emitter = drive.automation(definition({"step_id": "emit", "action": "emit_event",
                                           "config": {"event_type": "chain.next", "payload": {}}}),
                               user=people.operator)  # fmt: skip
    subscriber = drive.automation({**gated(target, path_for), "name": "down the chain",
                                   "triggers": [{"key": "on", "type": "event",
                                                 "config": {"event_type": "chain.next"}}]},
                                  user=people.operator)  # fmt: skip
    first = drive.start(emitter, user=people.owner)
    assert first.status == "succeeded"
    # when: the emitted event is delivered and the second run reaches its gate
    from automations.models import DomainEvent

    for event in DomainEvent.objects.filter(event_type="chain.next"):
        events.deliver(str(event.pk))
    run = executed(Run.objects.get(automation=subscriber).pk)
    # then
    assert run.status == "awaiting_approval"
    assert refused(drive, drive.approval(run), people.owner).http_status == 403


def test_the_last_editor_cannot_create_a_standing_approval_under_four_eyes(drive, people, target, path_for,
                                                                           four_eyes):  # fmt: skip
    automation = drive.automation(gated(target, path_for), user=people.owner)
    with pytest.raises(ApprovalError) as info:
        standing_approval_create(workspace=people.workspace, automation_id=automation.pk,
                                 capability_id="http_request", max_uses=5, user=people.owner,
                                 expires_at=_in_an_hour())  # fmt: skip
    assert (info.value.code, info.value.http_status) == ("PERMISSION_DENIED", 403)
    assert not StandingApproval.objects.exists()
    # and the run still needs a second person
    assert drive.start(automation, user=people.owner).status == "awaiting_approval"


def test_a_standing_approval_does_not_cover_its_creators_own_run_under_four_eyes(
    drive, people, target, path_for, four_eyes
):
    # given: owner pre-authorises an automation operator wrote (allowed: owner is not its editor)
    automation = drive.automation(gated(target, path_for), user=people.operator)
    standing_approval_create(workspace=people.workspace, automation_id=automation.pk, capability_id="http_request",
                             max_uses=5, user=people.owner, expires_at=_in_an_hour())  # fmt: skip
    # when / then: owner's own run is not covered by his own standing approval
    assert drive.start(automation, user=people.owner).status == "awaiting_approval"
    assert StandingApproval.objects.get().uses == 0
    assert "approval.standing.skipped" in audit_types(Run.objects.latest("created_at").trace_id)
    # while someone else's run is covered: owner is the second person there
    assert drive.start(automation, user=people.operator).status == "succeeded"
    assert StandingApproval.objects.get().uses == 1


def test_without_four_eyes_the_last_editor_may_create_a_standing_approval(drive, people, target, path_for):
    automation = drive.automation(gated(target, path_for), user=people.owner)
    standing_approval_create(workspace=people.workspace, automation_id=automation.pk, capability_id="http_request",
                             max_uses=5, user=people.owner, expires_at=_in_an_hour())  # fmt: skip
    assert drive.start(automation, user=people.owner).status == "succeeded"


def test_standing_approvals_for_foreign_or_missing_automations_are_refused(drive, people, target, path_for):
    foreign = drive.automation(
        gated(target, path_for), user=people.outsider, workspace=people.other_workspace
    )
    client = client_for(people.alice)
    base = {"capability_id": "http_request", "max_uses": 1, "expires_in_seconds": 3600, "workspace": "acme"}

    other = client.post(
        "/api/v1/standing-approvals", {**base, "automation_id": str(foreign.pk)}, format="json"
    )
    missing = client.post("/api/v1/standing-approvals",
                          {**base, "automation_id": "6b1f0c0e-1111-4111-8111-111111111111"}, format="json")  # fmt: skip
    not_an_id = client.post("/api/v1/standing-approvals", {**base, "automation_id": "nope"}, format="json")

    assert (other.status_code, other.json()["error"]["code"]) == (404, "NOT_FOUND")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
    assert not_an_id.status_code == 400
    assert not StandingApproval.objects.exists()


def _in_an_hour():
    from datetime import timedelta

    from django.utils import timezone

    return timezone.now() + timedelta(hours=1)
