"""Workspaces and members in the admin: settings and roles changed through the audited services, by
the workspace's admins only; a bad egress allowlist is an inline error."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from tests.factories import member
from workspaces.models import Membership, Role

pytestmark = pytest.mark.django_db


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(content_type__app_label="workspaces"))
    client = Client()
    client.force_login(user)
    return client


def _form(workspace, members, **changes) -> dict:
    data = {"name": workspace.name, "egress_allowlist": json.dumps(workspace.egress_allowlist),
            "default_autonomy": workspace.default_autonomy,
            "memberships-TOTAL_FORMS": str(len(members)), "memberships-INITIAL_FORMS": str(len(members)),
            "memberships-MIN_NUM_FORMS": "0", "memberships-MAX_NUM_FORMS": "1000"}  # fmt: skip
    if workspace.four_eyes:
        data["four_eyes"] = "on"
    for i, membership in enumerate(members):
        data |= {f"memberships-{i}-id": str(membership.pk), f"memberships-{i}-workspace": str(workspace.pk),
                 f"memberships-{i}-user": str(membership.user_id), f"memberships-{i}-role": membership.role}  # fmt: skip
    data.update(changes)
    return data


def _members(workspace):
    return list(Membership.objects.filter(workspace=workspace).order_by("pk"))


def test_a_workspace_admin_sets_four_eyes_and_the_allowlist_audited(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    admin = staff(owner)

    response = admin.post(url, _form(workspace, _members(workspace), four_eyes="on",
                                     egress_allowlist='["10.0.0.0/8", "Intranet.Local"]'))  # fmt: skip

    assert response.status_code == 302
    workspace.refresh_from_db()
    assert workspace.four_eyes is True
    assert workspace.egress_allowlist == ["10.0.0.0/8", "intranet.local"]
    row = AuditEvent.objects.get(type="operator.workspace.updated")
    assert row.actor == "user:owner"
    assert row.payload["four_eyes"] == {"from": False, "to": True}


def test_a_workspace_admin_sets_the_default_autonomy_audited(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])

    refused = staff(owner).post(url, _form(workspace, _members(workspace), default_autonomy="A9"))
    response = staff(owner).post(url, _form(workspace, _members(workspace), default_autonomy="A1"))

    assert refused.status_code == 200  # the form again, with the error inline
    assert "A9 is not one of the available choices" in refused.content.decode()
    assert response.status_code == 302
    workspace.refresh_from_db()
    assert workspace.default_autonomy == "A1"
    row = AuditEvent.objects.get(type="operator.workspace.updated")
    assert row.payload == {"default_autonomy": {"from": "A3", "to": "A1"}}


def test_a_bad_allowlist_entry_is_an_inline_error(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])

    response = staff(owner).post(
        url, _form(workspace, _members(workspace), egress_allowlist='["not a host!"]')
    )

    assert response.status_code == 200
    assert "is not a host name" in response.content.decode()
    workspace.refresh_from_db()
    assert "not a host!" not in workspace.egress_allowlist


def test_members_are_added_re_roled_and_removed_through_the_services(workspace, owner, operator, viewer):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    members = _members(workspace)
    newcomer = member("newcomer", workspace, Role.VIEWER)
    Membership.objects.filter(user=newcomer).delete()
    data = _form(workspace, members)
    n = len(members)
    index = {m.user_id: i for i, m in enumerate(members)}
    data[f"memberships-{index[operator.pk]}-role"] = Role.APPROVER
    data[f"memberships-{index[viewer.pk]}-DELETE"] = "on"
    data |= {"memberships-TOTAL_FORMS": str(n + 1), f"memberships-{n}-user": str(newcomer.pk),
             f"memberships-{n}-role": Role.OPERATOR, f"memberships-{n}-workspace": str(workspace.pk)}  # fmt: skip

    response = staff(owner).post(url, data)

    assert response.status_code == 302
    roles = dict(Membership.objects.filter(workspace=workspace).values_list("user__username", "role"))
    assert roles == {"owner": "admin", "operator": "approver", "newcomer": "operator"}
    kinds = list(
        AuditEvent.objects.filter(type__startswith="operator.membership").values_list("type", "actor")
    )
    assert ("operator.membership.removed", "user:owner") in kinds
    assert kinds.count(("operator.membership.role_changed", "user:owner")) == 2


@pytest.mark.parametrize("change", ["demote", "delete"])
def test_the_last_admin_cannot_be_demoted_or_removed_and_nothing_is_saved(workspace, owner, viewer, change):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    members = _members(workspace)
    index = {m.user_id: i for i, m in enumerate(members)}
    edit = {f"memberships-{index[owner.pk]}-role": Role.OPERATOR} if change == "demote" else {
        f"memberships-{index[owner.pk]}-DELETE": "on"}  # fmt: skip

    response = staff(owner).post(url, _form(workspace, members, name="renamed", four_eyes="on", **edit))

    assert response.status_code == 200
    assert "LAST_ADMIN" in response.content.decode()
    workspace.refresh_from_db()
    assert (workspace.name, workspace.four_eyes) == ("acme", False)
    roles = dict(Membership.objects.filter(workspace=workspace).values_list("user__username", "role"))
    assert roles == {"owner": "admin", "viewer": "viewer"}
    assert not AuditEvent.objects.filter(type__startswith="operator.").exclude(actor="system").exists()


def test_an_operator_cannot_change_the_workspace(workspace, operator):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])
    admin = staff(operator)

    page = admin.get(url)
    response = admin.post(url, _form(workspace, _members(workspace), four_eyes="on"))

    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    assert response.status_code == 403
    workspace.refresh_from_db()
    assert workspace.four_eyes is False


def test_staff_see_only_their_workspaces(workspace, other_workspace, outsider):
    body = staff(outsider).get(reverse("admin:workspaces_workspace_changelist")).content.decode()

    assert "globex" in body
    assert "acme" not in body


def test_the_admin_refuses_an_allowlist_entry_on_the_platform_deny_list(workspace, owner):
    url = reverse("admin:workspaces_workspace_change", args=[workspace.pk])

    response = staff(owner).post(url, _form(workspace, _members(workspace), egress_allowlist='["0.0.0.0/0"]'))

    assert response.status_code == 200  # the form again, with the error inline
    assert "deny-list" in response.content.decode()
    workspace.refresh_from_db()
    assert workspace.egress_allowlist == []
