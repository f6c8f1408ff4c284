"""Who sets the gate's policies (issue 29): a workspace's ``policies`` and ``quiet_hours`` are set by
its admins (API and admin); an operator's PATCH is 403 and changes nothing; a malformed rule or
window is a 400 naming it, at save, and changes nothing. A step's own ``policy`` is checked when the
definition is saved. A credential's ``approval_always`` is set by those who manage credentials."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations.models import Automation
from capabilities.models import Credential
from tests.factories import client_for, definition, http_step
from workspaces.models import Membership, Workspace

pytestmark = pytest.mark.django_db

RULES = [
    {"when": {"path": "json.amount", "lte": 50}, "then": "auto", "reason": "small refunds run"},
    {"when": {"path": "json.amount", "lte": 500}, "then": "ask", "reason": "refunds up to 500 ask"},
    {"when": {"path": "json.amount", "gt": 500}, "then": "block", "reason": "refunds over 500 are blocked"},
]
NIGHT = {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}


def test_an_admin_sets_policies_and_quiet_hours_audited(api, workspace):
    response = api.patch("/api/v1/workspaces/acme", {"policies": RULES, "quiet_hours": NIGHT}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["policies"] == RULES
    assert response.json()["quiet_hours"] == NIGHT
    row = AuditEvent.objects.get(type="operator.workspace.updated")
    assert row.payload["policies"] == {"from": [], "to": RULES}
    assert row.payload["quiet_hours"] == {"from": None, "to": NIGHT}

    cleared = api.patch("/api/v1/workspaces/acme", {"policies": [], "quiet_hours": None}, format="json")
    assert (cleared.json()["policies"], cleared.json()["quiet_hours"]) == ([], None)


@pytest.mark.parametrize(
    "change",
    [{"policies": []}, {"policies": RULES}, {"quiet_hours": None}, {"quiet_hours": NIGHT},
     {"policies": [{"when": {"path": "method", "exists": True}, "then": "auto"}]}],
)  # fmt: skip
def test_an_operator_cannot_change_the_policies_or_quiet_hours(api, workspace, operator, change):
    api.patch("/api/v1/workspaces/acme", {"policies": RULES[1:], "quiet_hours": NIGHT}, format="json")
    before = Workspace.objects.filter(pk=workspace.pk).values("policies", "quiet_hours").get()

    response = client_for(operator).patch("/api/v1/workspaces/acme", change, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert Workspace.objects.filter(pk=workspace.pk).values("policies", "quiet_hours").get() == before
    assert not AuditEvent.objects.filter(type="operator.workspace.updated", actor="user:operator").exists()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"policies": [*RULES[:2], {"when": {"path": "json.amount"}, "then": "block"}]}, "/policies/2/when"),
        ({"policies": [{"when": {"path": "a", "gt": 1}, "then": "permit"}]}, "/policies/0/then"),
        ({"policies": [{"when": {"path": "a", "regex": "(?=x)"}, "then": "ask"}]}, "/policies/0/when/regex"),
        ({"policies": {"when": {}}}, "/policies"),
        ({"policies": "block everything"}, "/policies"),
        ({"policies": None}, "/policies"),
        ({"policies": [{"when": {"path": "a", "gt": 1}, "then": "ask"}] * 101}, "/policies"),
        ({"quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Berlin"}}, "/quiet_hours/timezone"),
        ({"quiet_hours": {"start": "10pm", "end": "07:00", "timezone": "UTC"}}, "/quiet_hours/start"),
        ({"policies": RULES, "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": 3}},
         "/quiet_hours/timezone"),
    ],
)  # fmt: skip
def test_a_malformed_rule_or_window_is_a_400_naming_it_and_changes_nothing(api, workspace, body, path):
    response = api.patch("/api/v1/workspaces/acme", body, format="json")

    assert response.status_code == 400
    errors = response.json()["errors"]
    assert path in [error["path"] for error in errors], errors
    assert Workspace.objects.filter(pk=workspace.pk).values("policies", "quiet_hours").get() == {
        "policies": [], "quiet_hours": None}  # fmt: skip


def test_the_bad_rules_path_is_in_the_message_too(api, workspace):
    body = {"policies": [*RULES[:2], {"when": {"path": "json.amount", "between": [1, 2]}, "then": "ask"}]}

    errors = api.patch("/api/v1/workspaces/acme", body, format="json").json()["errors"]

    assert errors[0]["message"].startswith("policies[2].when: ")


def test_a_definition_with_a_malformed_step_policy_is_a_400_naming_the_rule(api, workspace):
    step = http_step("refund", "http://127.0.0.1/refund", "POST",
                     policy=[RULES[0], {"when": {"path": "json.amount", "gt": "a", "lt": 1}, "then": "block"}])  # fmt: skip

    response = api.post("/api/v1/automations", definition(step), format="json")

    assert response.status_code == 400
    assert "/plan/0/policy/1/when" in [error["path"] for error in response.json()["errors"]]
    assert not Automation.objects.exists()


def test_a_definition_with_a_valid_step_policy_saves(api, workspace):
    step = http_step("refund", "http://127.0.0.1/refund", "POST", policy=RULES)

    response = api.post("/api/v1/automations", definition(step), format="json")

    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "policy", ["ask", {"then": "ask"}, [{"when": {"path": "a", "gt": 1}, "then": "lenient"}]]
)
def test_a_step_policy_that_is_not_a_rule_list_is_refused(api, workspace, policy):
    step = http_step("refund", "http://127.0.0.1/refund", "POST", policy=policy)

    response = api.post("/api/v1/automations", definition(step), format="json")

    assert response.status_code == 400
    assert any(error["path"].startswith("/plan/0/policy") for error in response.json()["errors"])


def test_a_schedule_trigger_takes_quiet_hours_skip_and_nothing_else(api, workspace):
    def save(value):
        trigger = {
            "key": "nightly",
            "type": "schedule",
            "config": {"cron": "0 * * * *", "quiet_hours": value},
        }
        return api.post("/api/v1/automations", definition(triggers=[trigger]), format="json")

    assert save("skip").status_code == 201
    assert save("sometimes").status_code == 400


def test_approval_always_is_set_and_shown_over_the_api(api, workspace):
    created = api.post("/api/v1/credentials", {"name": "payments", "kind": "bearer", "secret": {"token": "t" * 20},
                                               "approval_always": True}, format="json")  # fmt: skip
    assert created.status_code == 201, created.content
    assert created.json()["approval_always"] is True

    changed = api.post(
        f"/api/v1/credentials/{created.json()['id']}/secret", {"approval_always": False}, format="json"
    )
    assert changed.status_code == 200, changed.content
    assert Credential.objects.get().approval_always is False
    assert AuditEvent.objects.filter(type="credential.updated", payload__approval_always=False).exists()


def test_an_operator_cannot_lift_approval_always(api, workspace, operator):
    created = api.post("/api/v1/credentials", {"name": "payments", "kind": "bearer", "secret": {"token": "t" * 20},
                                               "approval_always": True}, format="json")  # fmt: skip

    response = client_for(operator).post(f"/api/v1/credentials/{created.json()['id']}/secret",
                                         {"approval_always": False}, format="json")  # fmt: skip

    assert response.status_code == 403
    assert Credential.objects.get().approval_always is True


# --- the admin ---------------------------------------------------------------------------


def _staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(content_type__app_label="workspaces"))
    client = Client()
    client.force_login(user)
    return client


def _form(workspace, **changes) -> dict:
    members = list(Membership.objects.filter(workspace=workspace).order_by("pk"))
    data = {"name": workspace.name, "egress_allowlist": json.dumps(workspace.egress_allowlist),
            "default_autonomy": workspace.default_autonomy, "policies": "[]", "quiet_hours": "",
            "memberships-TOTAL_FORMS": str(len(members)), "memberships-INITIAL_FORMS": str(len(members)),
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}  # fmt: skip
    for i, membership in enumerate(members):
        data |= {f"memberships-{i}-id": str(membership.pk), f"memberships-{i}-workspace": str(workspace.pk),
                 f"memberships-{i}-user": str(membership.user_id), f"memberships-{i}-role": membership.role}  # fmt: skip
    return data | changes


def test_a_workspace_admin_sets_policies_and_quiet_hours_in_the_admin(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])

    response = _staff(owner).post(
        url, _form(workspace, policies=json.dumps(RULES), quiet_hours=json.dumps(NIGHT))
    )

    assert response.status_code == 302
    workspace.refresh_from_db()
    assert (workspace.policies, workspace.quiet_hours) == (RULES, NIGHT)
    assert AuditEvent.objects.get(type="operator.workspace.updated").actor == "user:owner"


def test_a_bad_rule_or_window_is_an_inline_admin_error_and_saves_nothing(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    bad_rule = json.dumps([RULES[0], {"when": {"path": "x"}, "then": "ask"}])
    bad_zone = json.dumps({"start": "22:00", "end": "07:00", "timezone": "Nowhere/Land"})

    refused_rule = _staff(owner).post(url, _form(workspace, policies=bad_rule))
    refused_zone = _staff(owner).post(url, _form(workspace, quiet_hours=bad_zone))

    assert refused_rule.status_code == 200
    assert "policies[1].when" in refused_rule.content.decode()
    assert refused_zone.status_code == 200
    assert "is not an IANA time zone" in refused_zone.content.decode()
    workspace.refresh_from_db()
    assert (workspace.policies, workspace.quiet_hours) == ([], None)


def test_an_operator_cannot_change_policies_in_the_admin(workspace, owner, operator):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])

    response = _staff(operator).post(url, _form(workspace, policies="[]", quiet_hours=json.dumps(NIGHT)))

    assert response.status_code == 403
    workspace.refresh_from_db()
    assert workspace.quiet_hours is None
