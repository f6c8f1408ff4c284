"""/api/v1/workspaces and /members: the workspace's admins read and change settings and members through
the audited services; others get 403 (members) or 404 (non-members)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from audit.models import AuditEvent
from tests.factories import client_for
from workspaces import denylist
from workspaces.models import Membership

pytestmark = pytest.mark.django_db


def test_a_member_lists_their_workspaces_with_their_role(workspace, other_workspace, operator):
    body = client_for(operator).get("/api/v1/workspaces").json()

    assert body["results"] == [{"slug": "acme", "name": "acme", "role": "operator"}]


def test_an_admin_reads_and_patches_the_workspace_audited(api, workspace):
    assert api.get("/api/v1/workspaces/acme").json()["four_eyes"] is False

    response = api.patch("/api/v1/workspaces/acme", {"four_eyes": True, "egress_allowlist": ["10.1.0.0/16"]},
                         format="json")  # fmt: skip

    assert response.status_code == 200
    assert response.json()["four_eyes"] is True
    assert response.json()["egress_allowlist"] == ["10.1.0.0/16"]
    assert AuditEvent.objects.filter(type="operator.workspace.updated", actor="user:owner").count() == 1


def test_a_bad_allowlist_is_a_located_400_and_changes_nothing(api, workspace):
    response = api.patch(
        "/api/v1/workspaces/acme", {"egress_allowlist": ["ok.example", "no spaces"]}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/egress_allowlist/1"
    workspace.refresh_from_db()
    assert "ok.example" not in workspace.egress_allowlist


def test_members_are_set_and_removed_by_an_admin(api, workspace, viewer):
    get_user_model().objects.create_user("newbie")

    added = api.post(
        "/api/v1/workspaces/acme/members", {"username": "newbie", "role": "approver"}, format="json"
    )
    changed = api.post(
        "/api/v1/workspaces/acme/members", {"username": "viewer", "role": "operator"}, format="json"
    )
    removed = api.delete("/api/v1/workspaces/acme/members", {"username": "newbie"}, format="json")
    listing = api.get("/api/v1/workspaces/acme/members").json()

    assert (added.status_code, changed.status_code, removed.status_code) == (200, 200, 204)
    assert {m["username"]: m["role"] for m in listing["results"]} == {"owner": "admin", "viewer": "operator"}
    types = set(AuditEvent.objects.filter(actor="user:owner").values_list("type", flat=True))
    assert {"operator.membership.role_changed", "operator.membership.removed"} <= types


def test_an_operator_gets_403_and_a_stranger_404(workspace, operator, outsider):
    assert client_for(operator).get("/api/v1/workspaces/acme").status_code == 403
    assert client_for(operator).post("/api/v1/workspaces/acme/members", {"username": "operator", "role": "admin"},
                                     format="json").status_code == 403  # fmt: skip
    assert client_for(outsider).get("/api/v1/workspaces/acme").status_code == 404
    assert Membership.objects.get(user=operator).role == "operator"


def test_only_a_superuser_creates_a_workspace(api):
    refused = api.post("/api/v1/workspaces", {"slug": "new-one"}, format="json")
    root = get_user_model().objects.create_superuser("root", password="pw")

    created = client_for(root).post("/api/v1/workspaces", {"slug": "new-one", "name": "New"}, format="json")

    assert refused.status_code == 403
    assert created.status_code == 201
    assert Membership.objects.get(workspace__slug="new-one").user == root


def test_an_admin_sets_the_default_autonomy_audited(api, workspace):
    assert api.get("/api/v1/workspaces/acme").json()["default_autonomy"] == "A3"

    response = api.patch("/api/v1/workspaces/acme", {"default_autonomy": "A1"}, format="json")

    assert response.status_code == 200
    assert response.json()["default_autonomy"] == "A1"
    workspace.refresh_from_db()
    assert workspace.default_autonomy == "A1"
    audited = AuditEvent.objects.get(type="operator.workspace.updated")
    assert audited.payload == {"default_autonomy": {"from": "A3", "to": "A1"}}


@pytest.mark.parametrize("bad", ["A5", "a2", "", 3, None])
def test_a_bad_default_autonomy_is_a_located_400_and_changes_nothing(api, workspace, bad):
    response = api.patch(
        "/api/v1/workspaces/acme", {"default_autonomy": bad, "four_eyes": True}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/default_autonomy"
    assert response.json()["errors"][0]["code"] == "INVALID_ARGUMENT"
    workspace.refresh_from_db()
    assert (workspace.default_autonomy, workspace.four_eyes) == ("A3", False)
    assert not AuditEvent.objects.filter(type="operator.workspace.updated").exists()


def test_an_operator_cannot_change_the_default_autonomy(workspace, operator):
    response = client_for(operator).patch(
        "/api/v1/workspaces/acme", {"default_autonomy": "A4"}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    workspace.refresh_from_db()
    assert workspace.default_autonomy == "A3"


def test_the_last_admin_cannot_be_demoted_or_removed(api, workspace, owner):
    demoted = api.post(
        "/api/v1/workspaces/acme/members", {"username": "owner", "role": "operator"}, format="json"
    )
    removed = api.delete("/api/v1/workspaces/acme/members", {"username": "owner"}, format="json")

    for response in (demoted, removed):
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "LAST_ADMIN"
    assert Membership.objects.get(user=owner).role == "admin"
    assert (
        not AuditEvent.objects.filter(type__startswith="operator.membership").exclude(actor="system").exists()
    )


def test_with_a_second_admin_the_first_may_step_down(api, workspace, owner, viewer):
    api.post("/api/v1/workspaces/acme/members", {"username": "viewer", "role": "admin"}, format="json")

    demoted = api.post(
        "/api/v1/workspaces/acme/members", {"username": "owner", "role": "viewer"}, format="json"
    )
    last = client_for(viewer).delete("/api/v1/workspaces/acme/members", {"username": "viewer"}, format="json")

    assert demoted.status_code == 200
    assert last.status_code == 409
    assert dict(Membership.objects.filter(workspace=workspace).values_list("user__username", "role")) == {
        "owner": "viewer", "viewer": "admin"}  # fmt: skip


def test_create_api_token_will_not_demote_the_last_admin(workspace, owner):
    with pytest.raises(CommandError, match="LAST_ADMIN"):
        call_command("create_api_token", "owner", "--workspace", "acme", "--role", "viewer")

    assert Membership.objects.get(user=owner).role == "admin"


HOSTILE_ALLOWLIST_ENTRIES = [
    "127.0.0.0/8", "127.0.0.1", "::1", "[::1]", "[::ffff:127.0.0.1]", "::ffff:0:0/96", "0.0.0.0/0", "::/0",
    "0.0.0.0", "169.254.0.0/16", "169.254.169.254", "fd00:ec2::254", "fe80::/10", "2130706433", "0x7f000001",
    "127.1", "localhost", "api.localhost", "metadata.google.internal", "2002::/16", "64:ff9b::/96",
]  # fmt: skip


@pytest.mark.parametrize("entry", HOSTILE_ALLOWLIST_ENTRIES)
def test_an_allowlist_entry_overlapping_the_platform_deny_list_is_refused(api, workspace, entry):
    response = api.patch(
        "/api/v1/workspaces/acme", {"egress_allowlist": ["10.1.0.0/16", entry]}, format="json"
    )

    assert response.status_code == 400
    error = response.json()["errors"][0]
    assert (error["path"], error["code"]) == ("/egress_allowlist/1", "egress_denied")
    assert "deny-list" in error["message"]
    workspace.refresh_from_db()
    assert workspace.egress_allowlist == []
    assert not AuditEvent.objects.filter(type="operator.workspace.updated").exists()


def test_a_name_resolving_into_the_deny_list_and_the_platform_hosts_are_refused(api, workspace, settings,
                                                                                monkeypatch):  # fmt: skip
    import socket

    real_getaddrinfo = socket.getaddrinfo
    answers = {"friendly.example": "127.0.0.1", "db.internal": "10.9.8.7"}

    def fake(host, *args, **kwargs):
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host], 0))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    monkeypatch.setattr(denylist, "_resolved", {})  # no answer cached from another test
    settings.CELERY_RESULT_BACKEND = "redis://db.internal:6379/1"
    settings.AUTOPLANE_EGRESS_DENYLIST = ["192.168.50.0/24"]

    for entry in (
        "friendly.example",
        "db.internal",
        "10.9.8.7",
        "10.0.0.0/8",
        "192.168.50.9",
        "192.168.0.0/16",
    ):
        response = api.patch("/api/v1/workspaces/acme", {"egress_allowlist": [entry]}, format="json")
        assert response.status_code == 400, entry
        assert response.json()["errors"][0]["code"] == "egress_denied"
    ok = api.patch("/api/v1/workspaces/acme", {"egress_allowlist": ["10.1.0.0/16", "192.168.51.0/24"]},
                   format="json")  # fmt: skip
    assert ok.status_code == 200
