"""Ceilings (issue 29): a workspace's admins set ``max_autonomy`` and ``min_approvals``; no definition
lifts them. A step is gated at min(its autonomy, max_autonomy) and needs max(approvals_required,
min_approvals) approvers, both read when the worker gates it. The people the gate restrains (operators,
who write definitions) cannot change either."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from audit.models import AuditEvent
from automations.models import Automation, RunStatus
from mcpserver.tools import tool_call
from tests.factories import client_for, definition, risk_step
from workspaces.models import Workspace
from workspaces.services import workspace_update

from .test_races import race

WORKSPACE = "/api/v1/workspaces/acme"


def _delete_a4(target, path: str) -> dict:
    """What the hostile tester saved as an operator: autonomy A4 and a high-risk step (HTTP DELETE)."""
    return definition(risk_step("high", target.url(path)), autonomy="A4")


def _created(client, doc: dict) -> dict:
    response = client.post("/api/v1/automations", doc, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_an_operators_A4_delete_step_asks_under_the_default_ceiling(drive, people, target, path_for):
    path = path_for("ceiling-delete")
    body = _created(client_for(people.operator), _delete_a4(target, path))

    # The definition saves as written (definitions are portable), and the answer says it is clamped.
    assert body["definition"]["execution"]["autonomy"] == "A4"
    assert body["effective_autonomy"] == "A3"
    assert [n["code"] for n in body["notices"]] == ["autonomy_clamped"]
    assert "max_autonomy A3" in body["notices"][0]["message"]

    run = drive.start(Automation.objects.get(pk=body["id"]))

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert target.count(path) == 0
    assert "at autonomy A3" in drive.approval(run).why
    shown = client_for(people.operator).get(f"/api/v1/automations/{body['id']}").json()
    assert shown["effective_autonomy"] == "A3"


def test_the_ceiling_is_read_at_gate_time_without_a_re_save(drive, people, target, path_for, api):
    path = path_for("ceiling-raised")
    automation = drive.automation(_delete_a4(target, path), user=people.operator)

    raised = api.patch(WORKSPACE, {"max_autonomy": "A4"}, format="json")
    assert raised.status_code == 200
    assert raised.json()["max_autonomy"] == "A4"
    assert drive.start(automation).status == RunStatus.SUCCEEDED  # the admin let A4 through
    assert client_for(people.operator).get(f"/api/v1/automations/{automation.pk}").json()["notices"] == []

    api.patch(WORKSPACE, {"max_autonomy": "A1"}, format="json")
    lowered = drive.start(automation)

    assert lowered.status == RunStatus.AWAITING_APPROVAL
    assert "at autonomy A1" in drive.approval(lowered).why
    assert target.count(path) == 1
    shown = client_for(people.operator).get(f"/api/v1/automations/{automation.pk}").json()
    assert (shown["version"], shown["effective_autonomy"]) == (1, "A1")


def test_a_workspace_default_above_the_ceiling_is_clamped_too(drive, people, target, path_for, api):
    path = path_for("ceiling-default")
    api.patch(WORKSPACE, {"default_autonomy": "A4", "max_autonomy": "A2"}, format="json")
    automation = drive.automation(definition(risk_step("medium", target.url(path))), user=people.operator)

    run = drive.start(automation)

    assert run.status == RunStatus.AWAITING_APPROVAL  # medium asks at A2
    body = client_for(people.operator).get(f"/api/v1/automations/{automation.pk}").json()
    assert body["effective_autonomy"] == "A2"
    assert body["notices"][0]["code"] == "autonomy_clamped"


@pytest.mark.parametrize("body", [{"max_autonomy": "A4"}, {"max_autonomy": "A0"}, {"min_approvals": 1},
                                  {"min_approvals": 3}, {"max_autonomy": "A4", "min_approvals": 1}])  # fmt: skip
def test_an_operator_cannot_change_a_ceiling(workspace, operator, body):
    Workspace.objects.filter(pk=workspace.pk).update(min_approvals=2)

    response = client_for(operator).patch(WORKSPACE, body, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    workspace.refresh_from_db()
    assert (workspace.max_autonomy, workspace.min_approvals) == ("A3", 2)
    assert not AuditEvent.objects.filter(type="operator.workspace.updated").exists()


@pytest.mark.parametrize(
    ("field", "bad"),
    [("max_autonomy", "A5"), ("max_autonomy", "a4"), ("max_autonomy", ""), ("max_autonomy", None),
     ("max_autonomy", 4), ("max_autonomy", ["A4"]), ("min_approvals", 0), ("min_approvals", 6),
     ("min_approvals", -1), ("min_approvals", True), ("min_approvals", "2"), ("min_approvals", 2.5),
     ("min_approvals", None), ("min_approvals", 2**40)],
)  # fmt: skip
def test_a_bad_ceiling_is_a_located_400_and_changes_nothing(api, workspace, field, bad):
    response = api.patch(WORKSPACE, {field: bad, "four_eyes": True}, format="json")

    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["path"] == f"/{field}"
    workspace.refresh_from_db()
    assert (workspace.max_autonomy, workspace.min_approvals, workspace.four_eyes) == ("A3", 1, False)
    assert not AuditEvent.objects.filter(type="operator.workspace.updated").exists()


def test_a_ceiling_change_is_audited_with_what_it_replaced(api, workspace, owner):
    api.patch(WORKSPACE, {"max_autonomy": "A1", "min_approvals": 2}, format="json")

    row = AuditEvent.objects.get(type="operator.workspace.updated")
    assert row.payload["max_autonomy"] == {"from": "A3", "to": "A1"}
    assert row.payload["min_approvals"] == {"from": 1, "to": 2}
    assert row.actor == f"user:{owner.username}" or owner.username in row.actor


def test_min_approvals_raises_every_gated_steps_quorum(drive, people, target, path_for, api):
    path = path_for("quorum")
    api.patch(WORKSPACE, {"min_approvals": 2}, format="json")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"),
                                  user=people.operator)  # fmt: skip
    run = drive.start(automation)
    approval = drive.approval(run)

    shown = client_for(people.alice).get(f"/api/v1/approvals/{approval.pk}").json()
    assert shown["approvals_required"] == 2
    drive.decide(approval, people.alice)
    assert Approval.objects.get(pk=approval.pk).status == "pending"  # one yes is not enough
    drive.decide(approval, people.bob)
    assert drive.resume(run).status == RunStatus.SUCCEEDED
    assert target.count(path) == 1


def test_a_step_asking_more_than_min_approvals_keeps_its_own_quorum(drive, people, target, path_for):
    Workspace.objects.filter(pk=people.workspace.pk).update(min_approvals=2)
    step = {**risk_step("medium", target.url(path_for("quorum-3"))), "approvals_required": 3}
    run = drive.start(drive.automation(definition(step, autonomy="A2"), user=people.operator))

    assert drive.approval(run).approvals_required == 3


def test_the_admin_form_sets_and_validates_the_ceilings(workspace, owner, operator):
    from django.urls import reverse

    from tests.test_workspace_admin import _form, _members, staff

    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    admin = staff(owner)

    bad = admin.post(url, _form(workspace, _members(workspace), max_autonomy="A9", min_approvals="9"))
    assert bad.status_code == 200  # the form again, with its errors
    workspace.refresh_from_db()
    assert (workspace.max_autonomy, workspace.min_approvals) == ("A3", 1)

    good = admin.post(url, _form(workspace, _members(workspace), max_autonomy="A1", min_approvals="3"))
    assert good.status_code == 302
    workspace.refresh_from_db()
    assert (workspace.max_autonomy, workspace.min_approvals) == ("A1", 3)
    row = AuditEvent.objects.get(type="operator.workspace.updated")
    assert row.payload["max_autonomy"] == {"from": "A3", "to": "A1"}

    # An operator with staff access may see the workspace, never change its ceilings.
    refused = staff(operator).post(url, _form(workspace, _members(workspace), max_autonomy="A4"))
    assert refused.status_code == 403
    workspace.refresh_from_db()
    assert workspace.max_autonomy == "A1"


def test_the_mcp_server_shows_and_applies_the_ceiling(drive, people, target, path_for):
    path = path_for("ceiling-mcp")
    automation = drive.automation(_delete_a4(target, path), user=people.operator)

    described = tool_call(user=people.operator, name="describe_automation",
                          arguments={"automation_id": str(automation.pk)})  # fmt: skip
    assert described["automation"]["effective_autonomy"] == "A3"
    started = tool_call(
        user=people.operator, name="run_automation", arguments={"automation_id": str(automation.pk)}
    )
    run = drive(started["run_id"])

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert target.count(path) == 0


@pytest.mark.django_db(transaction=True)
def test_two_admins_changing_the_ceiling_at_once_last_write_wins_and_each_is_audited(workspace, owner):
    from tests.factories import member
    from workspaces.models import Role

    second = member("second_admin", workspace, Role.ADMIN)
    for round_ in range(3):
        stale = Workspace.objects.get(pk=workspace.pk)  # both admins loaded the page before either saved
        wanted = ("A1", "A2") if round_ % 2 == 0 else ("A2", "A0")
        results = race(lambda: workspace_update(workspace=stale, user=owner, max_autonomy=wanted[0]),
                       lambda: workspace_update(workspace=stale, user=second, max_autonomy=wanted[1]))  # fmt: skip
        assert not any(isinstance(result, Exception) for result in results), results
    rows = list(AuditEvent.objects.filter(type="operator.workspace.updated").order_by("id"))
    final = Workspace.objects.get(pk=workspace.pk).max_autonomy
    # Each write read the value it replaced under the row lock: the rows chain, the last one is the value.
    changes = [row.payload["max_autonomy"] for row in rows]
    assert changes[0]["from"] == "A3"
    assert all(a["to"] == b["from"] for a, b in zip(changes, changes[1:], strict=False))
    assert changes[-1]["to"] == final


def test_the_automation_admin_shows_the_effective_autonomy_and_the_clamp(drive, people, target, path_for):
    from django.urls import reverse

    from tests.test_workspace_admin import staff

    automation = drive.automation(_delete_a4(target, path_for("ceiling-admin")), user=people.operator)
    from django.contrib.auth.models import Permission as AuthPermission

    people.operator.user_permissions.add(
        *AuthPermission.objects.filter(content_type__app_label="automations")
    )
    page = staff(people.operator).get(reverse("admin:automations_automation_change", args=[automation.pk]))

    assert page.status_code == 200
    text = page.content.decode()
    assert "effective autonomy" in text.lower()
    assert (
        "above this workspace&#x27;s max_autonomy A3" in text
        or "above this workspace's max_autonomy A3" in text
    )


@pytest.mark.parametrize("execution", [{"autonomy": "A4", "max_autonomy": "A4"}, {"min_approvals": 1},
                                       {"autonomy": "A5"}, {"autonomy": "a4"}])  # fmt: skip
def test_a_definition_cannot_carry_a_ceiling_of_its_own(people, execution):
    doc = {**definition(), "execution": execution}

    response = client_for(people.operator).post("/api/v1/automations", doc, format="json")

    assert response.status_code == 400
    assert response.json()["errors"][0]["path"].startswith("/execution")
    assert not Automation.objects.exists()


def test_a_step_cannot_lower_the_quorum_below_min_approvals(drive, people, target, path_for):
    Workspace.objects.filter(pk=people.workspace.pk).update(min_approvals=3)
    step = {**risk_step("medium", target.url(path_for("quorum-low"))), "approvals_required": 1}
    run = drive.start(drive.automation(definition(step, autonomy="A2"), user=people.operator))

    assert drive.approval(run).approvals_required == 3
