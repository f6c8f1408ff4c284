"""Edit, then approve (issue 30): an approver sends a whole config of the same action with their yes;
it is checked as a save checks that step, its risk and the gate are worked out again, the approval is
bound to its plan hash, the diff is audited, and the step runs the edit exactly, once. Any refusal
records nothing."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from approvals import tokens
from approvals.models import Approval, ApprovalDecision, ApprovalStatus
from audit.models import AuditEvent
from automations.models import RunStatus
from capabilities import credentials
from tests.factories import audit_types, client_for, definition, http_step
from workspaces.models import Workspace
from workspaces.services import workspace_update


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def _decide(user, approval, body, client=None):
    client = client or _client(user)
    return client.post(f"/api/v1/approvals/{approval.pk}/decide", body, format="json")


@pytest.fixture
def parked(drive, target, path_for):
    """A medium-risk POST waiting for a yes at A2, and a second path an approver may send it to instead."""
    path, other = path_for("original"), path_for("edited")
    step = http_step("create_item", target.url(path), "POST")
    step["config"]["json"] = {"amount": 30}
    run = drive.start(drive.automation(definition(step, autonomy="A2")))
    assert run.status == RunStatus.AWAITING_APPROVAL
    approval = drive.approval(run)
    edited = {"method": "POST", "url": target.url(other), "json": {"amount": 25, "note": "checked"}}
    return SimpleNamespace(run=run, approval=approval, path=path, other=other, edited=edited)


def _unchanged(approval: Approval) -> None:
    fresh = Approval.objects.get(pk=approval.pk)
    assert fresh.status == ApprovalStatus.PENDING
    assert fresh.plan_hash == approval.plan_hash
    assert fresh.what == approval.what
    assert fresh.edited_config is None
    assert not ApprovalDecision.objects.filter(approval=approval).exists()
    assert not AuditEvent.objects.filter(type__in=["approval.edited", "approval.approved"]).exists()


def test_the_edited_config_runs_exactly_once_and_the_diff_is_audited(drive, people, target, parked):
    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": parked.edited})

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "approved"
    assert body["what"] == parked.edited
    assert body["edited_by"] == "alice"
    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.plan_hash != parked.approval.plan_hash
    assert tokens.decode(approval.token)[1]["plan_hash"] == approval.plan_hash  # the token signs the edit
    edited = AuditEvent.objects.get(type="approval.edited")
    assert edited.actor == "user:alice"
    changes = {change["path"]: change for change in edited.payload["diff"]}
    assert changes["/url"]["after"] == parked.edited["url"]
    assert changes["/json/amount"] == {"path": "/json/amount", "before": 30, "after": 25}
    assert changes["/json/note"] == {"path": "/json/note", "after": "checked"}
    assert edited.payload["before"]["plan_hash"] == parked.approval.plan_hash

    run = drive.resume(parked.run)
    assert run.status == RunStatus.SUCCEEDED
    assert target.count(parked.other, "POST") == 1
    assert target.count(parked.path) == 0  # the original never ran
    assert drive.step(run, "create_item").rendered_config == parked.edited
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.CONSUMED
    assert drive.resume(run).status == RunStatus.SUCCEEDED  # a second resume runs nothing again
    assert target.count(parked.other, "POST") == 1
    types = audit_types(parked.run.trace_id)
    assert (
        types.index("approval.edited") < types.index("approval.approved") < types.index("approval.consumed")
    )
    assert "approval.invalidated" not in types


def test_a_quorum_the_edit_raises_keeps_it_pending_and_a_re_render_does_not_escape_it(drive, people):
    run = drive.start(
        drive.automation(
            definition(
                {"step_id": "gate", "action": "require_approval", "config": {"message": "ship it?"}},
                autonomy="A2",
            )
        )
    )
    approval = drive.approval(run)
    edit = {"message": "ship it, with the fix?", "approvals_required": 2}

    response = _decide(people.alice, approval, {"decision": "approve", "edited_config": edit})

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "pending"
    assert response.json()["approvals_required"] == 2
    assert response.json()["approvals_count"] == 1  # the edit is alice's approval
    assert response.json()["message"] == "ship it, with the fix?"
    # The run is woken again (a reminder, a sweep): the render of the original must not replace the edit.
    assert drive.resume(run).status == RunStatus.AWAITING_APPROVAL
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert Approval.objects.filter(run_id=run.pk).count() == 1

    assert _decide(people.bob, approval, {"decision": "approve"}).json()["status"] == "approved"
    run = drive.resume(run)
    assert run.status == RunStatus.SUCCEEDED
    assert drive.step(run, "gate").output["data"] == {"message": "ship it, with the fix?"}


def test_approvals_given_before_an_edit_do_not_count_for_it(drive, people):
    run = drive.start(drive.automation(definition(
        {"step_id": "gate", "action": "require_approval", "config": {"message": "go?", "approvals_required": 2}},
        autonomy="A2")))  # fmt: skip
    approval = drive.approval(run)
    assert _decide(people.bob, approval, {"decision": "approve"}).json()["approvals_count"] == 1

    edited = _decide(people.alice, approval, {"decision": "approve",
                                              "edited_config": {"message": "go, slower?", "approvals_required": 2}})  # fmt: skip

    assert edited.json()["status"] == "pending"
    assert edited.json()["approvals_count"] == 1  # alice's; bob said yes to another config
    assert AuditEvent.objects.get(type="approval.edited").payload["superseded_approvals"] == ["bob"]
    assert _decide(people.bob, approval, {"decision": "approve"}).json()["status"] == "approved"


def test_under_four_eyes_the_editor_is_not_the_only_approver(drive, people, parked):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    # the owner last edited the automation: four-eyes keeps them from deciding, with or without an edit
    assert (
        _decide(
            people.owner, parked.approval, {"decision": "approve", "edited_config": parked.edited}
        ).status_code
        == 403
    )
    _unchanged(parked.approval)

    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": parked.edited})

    assert response.json()["status"] == "pending"
    assert response.json()["approvals_required"] == 2
    assert _decide(people.bob, parked.approval, {"decision": "approve"}).json()["status"] == "approved"


def test_an_edit_a_workspace_policy_blocks_is_refused_and_records_nothing(drive, people, owner, parked):
    workspace_update(workspace=people.workspace, user=owner, policies=[
        {"when": {"path": "json.amount", "gt": 500}, "then": "block", "reason": "refunds over 500 are never sent"}])  # fmt: skip
    matched = AuditEvent.objects.filter(type="policy.matched").count()
    edit = {**parked.edited, "json": {"amount": 900}}

    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": edit})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "POLICY_VIOLATION"
    assert "refunds over 500 are never sent" in response.json()["error"]["message"]
    _unchanged(parked.approval)
    assert AuditEvent.objects.filter(type="policy.matched").count() == matched


@pytest.mark.parametrize(
    "edit",
    [
        {"message": "another action's config"},  # require_approval's shape, not http_request's
        {"method": "POST"},  # not whole: the url is missing
        {"method": "POST", "url": "http://127.0.0.1/x", "bogus": 1},
        {"method": "POST", "url": "http://127.0.0.1/{{ inputs.where }}"},  # an edit runs as written
        "not an object",
        None,
    ],
)
def test_an_edit_that_is_not_this_actions_config_is_refused(people, parked, edit):
    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": edit})

    assert response.status_code == 400, response.content
    # The save's answer ({"errors": [{path, code, message}]}), or INVALID_ARGUMENT when it is no object at all.
    body = response.json()
    assert body.get("errors") or body["error"]["code"] == "INVALID_ARGUMENT", body
    assert all(error["path"].startswith("/edited_config") for error in body.get("errors", []))
    _unchanged(parked.approval)


def test_an_edit_that_adds_a_credential_not_granted_is_refused(drive, people, parked):
    credentials.credential_create(workspace=people.workspace, name="payments", kind="bearer",
                                  secret={"token": "t-123456"}, allowed_destinations=["api.example.com"])  # fmt: skip
    edit = {**parked.edited, "credential": "payments"}

    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": edit})

    assert response.status_code == 400
    assert response.json()["errors"][0]["code"] == "credential_not_granted"
    assert response.json()["errors"][0]["path"] == "/edited_config/credential"
    _unchanged(parked.approval)


def test_who_may_edit_and_when(drive, people, parked):
    body = {"decision": "approve", "edited_config": parked.edited}

    assert _decide(people.operator, parked.approval, body).status_code == 403  # operators do not approve
    assert _decide(people.alice, parked.approval, body, client_for(people.alice, "mcp")).status_code == 403
    assert (
        _decide(people.alice, parked.approval, {**body, "decision": "deny", "reason": "no"}).status_code
        == 400
    )
    _unchanged(parked.approval)
    assert _decide(people.bob, parked.approval, {"decision": "deny", "reason": "wrong"}).status_code == 200

    late = _decide(people.alice, parked.approval, body)

    assert late.status_code == 409  # after the decision
    assert Approval.objects.get(pk=parked.approval.pk).edited_config is None
    assert not AuditEvent.objects.filter(type="approval.edited").exists()


def test_an_approver_edits_then_approves_in_the_admin(drive, people, target, parked):
    import json

    from django.contrib.auth.models import Permission as AuthPermission
    from django.test import Client

    people.alice.is_staff = True
    people.alice.save(update_fields=["is_staff"])
    people.alice.user_permissions.add(AuthPermission.objects.get(codename="view_approval"))
    client = Client()
    client.force_login(people.alice)
    page = client.get(f"/admin/approvals/approval/{parked.approval.pk}/change/").content.decode()
    assert 'id="edit-form"' in page
    assert target.url(parked.path) in page  # the textarea starts from what will run
    action = f"/admin/approvals/approval/{parked.approval.pk}/edit/"

    client.post(action, {"edited_config": "{not json"})
    client.post(action, {"edited_config": json.dumps({"message": "wrong shape"})})
    _unchanged(parked.approval)

    client.post(action, {"edited_config": json.dumps(parked.edited)})

    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.edited_config == parked.edited
    assert ApprovalDecision.objects.get(approval=approval).via == "admin"
    assert drive.resume(parked.run).status == RunStatus.SUCCEEDED
    assert target.count(parked.other, "POST") == 1
    page = client.get(f"/admin/approvals/approval/{parked.approval.pk}/change/").content.decode()
    assert 'id="edit-form"' not in page  # decided: nothing left to edit


def test_an_edit_the_gate_would_let_through_still_runs_on_its_approval(drive, people, target, parked):
    read = {"method": "GET", "url": target.url(parked.other)}  # low risk: A2 would not even ask

    response = _decide(people.alice, parked.approval, {"decision": "approve", "edited_config": read})

    assert response.json()["status"] == "approved"
    assert response.json()["risk"] == "low"
    run = drive.resume(parked.run)
    assert run.status == RunStatus.SUCCEEDED
    assert target.count(parked.other, "GET") == 1
    assert (
        Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.CONSUMED
    )  # used, not left open


def test_no_standing_approval_stands_in_for_an_edit(drive, people, target, parked):
    from datetime import timedelta

    from django.utils import timezone

    from approvals.models import StandingApproval
    from approvals.services import standing_approval_create

    assert (
        _decide(
            people.alice, parked.approval, {"decision": "approve", "edited_config": parked.edited}
        ).status_code
        == 200
    )
    standing_approval_create(workspace=people.workspace, automation_id=parked.run.automation_id,
                             capability_id="http_request", max_uses=5, expires_at=timezone.now() + timedelta(hours=1),
                             user=people.bob)  # fmt: skip

    run = drive.resume(parked.run)

    assert run.status == RunStatus.SUCCEEDED
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.CONSUMED  # the human's yes
    assert StandingApproval.objects.get().uses == 0
    assert target.count(parked.other, "POST") == 1
