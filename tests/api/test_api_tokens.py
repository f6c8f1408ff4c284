"""API tokens: hashed at rest, several per user with names, expiry and scope; the command's
defaults; the /tokens API and the admin; an ``mcp``-scoped token never decides an approval."""

from __future__ import annotations

import importlib
import io
from datetime import timedelta

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission as AuthPermission
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from approvals.models import Approval, ApprovalStatus, StandingApproval
from approvals.services import approval_decide
from audit.models import AuditEvent
from automations.models import Automation
from config.errors import ServiceError
from mcpserver.auth import user_for_token
from mcpserver.tools import TOOLS, tool_call
from ops.services import platform_bootstrap
from tests.factories import api_token, definition, member
from workspaces.api_tokens import LAST_USED_RESOLUTION, token_digest
from workspaces.models import ApiToken, Membership, Role

RUNS = "/api/v1/automations"


def _as(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _create_token(*args: str) -> str:
    out = io.StringIO()
    call_command("create_api_token", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def _every_row_as_text() -> str:
    """The whole database, every table, every row, as text: what a dump would show."""
    chunks = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names():
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            chunks.extend(repr(row) for row in cursor.fetchall())
    return "\n".join(chunks)


# --- at rest -----------------------------------------------------------------------------


def test_no_table_holds_the_token_only_its_digest_and_prefix(owner):
    token = _create_token("owner", "--workspace", "acme", "--name", "laptop")
    secret_part = token[12:]

    dump = _every_row_as_text()

    assert token not in dump
    assert secret_part not in dump
    row = ApiToken.objects.get(user=owner, name="laptop")
    assert row.digest == token_digest(token)
    assert row.prefix == token[:12]
    assert _as(token).get(RUNS).status_code == 200


def test_plaintext_drf_tokens_become_hashed_and_keep_working(db):
    user = get_user_model().objects.create(username="legacy")
    old = Token.objects.create(user=user)  # as the authtoken app stored them before
    migration = importlib.import_module("workspaces.migrations.0003_api_tokens")

    migration.hash_authtoken_tokens(apps, None)

    assert not Token.objects.exists()
    assert old.key not in _every_row_as_text()
    assert ApiToken.objects.get(user=user).scope == "full"
    assert _as(old.key).get(RUNS).status_code == 200


# --- several, named, expiring, revocable ----------------------------------------------------


def test_a_user_holds_several_tokens_each_working_and_revoked_alone(owner):
    laptop = _create_token("owner", "--workspace", "acme", "--name", "laptop")
    ci = _create_token("owner", "--workspace", "acme", "--name", "ci")
    listing = _as(laptop).get("/api/v1/tokens").json()

    assert {t["name"] for t in listing["results"]} == {"laptop", "ci"}
    assert all("token" not in t and "digest" not in t for t in listing["results"])
    ci_id = next(t["id"] for t in listing["results"] if t["name"] == "ci")
    assert _as(laptop).delete(f"/api/v1/tokens/{ci_id}").status_code == 204
    assert _as(ci).get(RUNS).status_code == 401
    assert _as(laptop).get(RUNS).status_code == 200
    assert AuditEvent.objects.filter(type="operator.api_token.revoked", payload__name="ci").exists()


def test_the_api_shows_a_new_token_once_and_never_again(owner):
    client = _as(api_token(owner))

    made = client.post("/api/v1/tokens", {"name": "script", "expires_in_days": 7}, format="json")

    assert made.status_code == 201, made.content
    body = made.json()
    assert body["token"].startswith(body["prefix"])
    assert body["scope"] == "full"
    assert _as(body["token"]).get(RUNS).status_code == 200
    assert "token" not in client.get(f"/api/v1/tokens/{body['id']}").json()
    assert body["token"] not in str(client.get("/api/v1/tokens").json())
    again = client.post("/api/v1/tokens", {"name": "script"}, format="json")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "CONFLICT"


def test_nobody_lists_or_revokes_anyone_elses_tokens(owner, viewer):
    theirs = ApiToken.objects.create(user=viewer, name="v", digest="0" * 64, prefix="apk_xxxxxxxx")
    client = _as(api_token(owner))

    assert client.get(f"/api/v1/tokens/{theirs.pk}").status_code == 404
    assert client.delete(f"/api/v1/tokens/{theirs.pk}").status_code == 404
    assert client.post(f"/api/v1/tokens/{theirs.pk}/revoke").status_code == 404
    assert ApiToken.objects.filter(pk=theirs.pk).exists()


def test_an_expired_token_is_a_401(owner):
    token = api_token(owner, expires_at=timezone.now() + timedelta(days=1))
    assert _as(token).get(RUNS).status_code == 200

    ApiToken.objects.filter(digest=token_digest(token)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    response = _as(token).get(RUNS)

    assert response.status_code == 401
    assert response.json()["error"] == {"code": "UNAUTHENTICATED", "message": "the token has expired"}


def test_last_used_is_written_at_most_once_a_minute(owner):
    token = api_token(owner)
    row = ApiToken.objects.get(digest=token_digest(token))
    assert row.last_used_at is None

    _as(token).get(RUNS)
    first = ApiToken.objects.get(pk=row.pk).last_used_at
    _as(token).get(RUNS)
    assert ApiToken.objects.get(pk=row.pk).last_used_at == first
    ApiToken.objects.filter(pk=row.pk).update(last_used_at=first - LAST_USED_RESOLUTION)
    _as(token).get(RUNS)

    assert first is not None
    assert ApiToken.objects.get(pk=row.pk).last_used_at > first


def test_authentication_is_one_lookup_by_digest(owner):
    client = _as(api_token(owner))
    client.get(RUNS)  # the first use writes last_used_at

    with CaptureQueriesContext(connection) as queries:
        assert client.get(RUNS).status_code == 200

    touching = [q["sql"] for q in queries.captured_queries if "workspaces_apitoken" in q["sql"]]
    assert len(touching) == 1
    assert touching[0].lstrip().upper().startswith("SELECT")
    assert '"digest" =' in touching[0]


# --- the command's defaults ----------------------------------------------------------------


def test_create_api_token_makes_a_viewer_by_default_and_keeps_an_existing_role(workspace, owner):
    token = _create_token("newcomer", "--workspace", "acme")
    _create_token("owner", "--workspace", "acme")

    assert Membership.objects.get(user__username="newcomer").role == Role.VIEWER
    assert Membership.objects.get(user=owner).role == Role.ADMIN
    refused = _as(token).post(RUNS, {"workspace": "acme", "definition": definition()}, format="json")
    assert refused.status_code == 403, refused.content


def test_create_api_token_never_replaces_unless_asked(workspace, owner):
    first = _create_token("owner", "--workspace", "acme")
    second = _create_token("owner", "--workspace", "acme")
    assert ApiToken.objects.filter(user=owner).count() == 2
    assert _as(first).get(RUNS).status_code == 200
    assert _as(second).get(RUNS).status_code == 200

    with pytest.raises(CommandError, match="CONFLICT"):
        _create_token("owner", "--workspace", "acme", "--name", "token")
    with pytest.raises(CommandError, match="NOT_FOUND"):
        _create_token("owner", "--workspace", "acme", "--replace", "no-such")
    rotated = _create_token("owner", "--workspace", "acme", "--replace", "token", "--expires-days", "30")

    assert _as(first).get(RUNS).status_code == 401
    assert _as(second).get(RUNS).status_code == 200
    assert _as(rotated).get(RUNS).status_code == 200
    row = ApiToken.objects.get(user=owner, name="token")
    assert row.digest == token_digest(rotated)
    assert row.expires_at > timezone.now() + timedelta(days=29)


@pytest.mark.parametrize("args", [["--expires-days", "0"], ["--scope", "root"], ["--name", " "]])
def test_create_api_token_refuses_bad_values_and_makes_nothing(workspace, owner, args):
    with pytest.raises((CommandError, SystemExit)):
        _create_token("owner", "--workspace", "acme", *args)

    assert not ApiToken.objects.exists()


# --- hostile headers and owners ------------------------------------------------------------


@pytest.mark.parametrize("header", [
    "Token", "Token a b", "Token \u00e9t\u00e9", "Token " + "x" * 5000, "token  ", "Token apk_",
])  # fmt: skip
def test_malformed_headers_are_a_clean_401(owner, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get(RUNS)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_no_prefix_or_partial_token_matches(owner):
    token = api_token(owner)

    for guess in (token[:12], token[:-1], token + "x", token.upper(), token_digest(token)):
        assert _as(guess).get(RUNS).status_code == 401, guess


def test_a_deleted_or_deactivated_users_token_is_refused(workspace):
    gone = member("gone", workspace, Role.OPERATOR)
    idle = member("idle", workspace, Role.OPERATOR)
    gone_token, idle_token = api_token(gone), api_token(idle)

    gone.delete()
    idle.is_active = False
    idle.save()

    assert _as(gone_token).get(RUNS).status_code == 401
    assert _as(idle_token).get(RUNS).status_code == 401
    assert not ApiToken.objects.filter(user_id=gone.pk).exists()


# --- mcp scope -----------------------------------------------------------------------------


@pytest.fixture
def pending(drive, workspace, operator):
    run = drive.start(drive.automation(definition(autonomy="A1")))
    approval = drive.approval(run)
    assert approval is not None
    assert approval.status == ApprovalStatus.PENDING
    return approval


def test_an_mcp_token_looks_and_runs_but_never_decides(people, pending):
    approver = _as(api_token(people.alice, scope="mcp"))
    admin = _as(api_token(people.owner, scope="mcp"))
    automation_id = str(pending.automation_id)

    assert approver.get(f"/api/v1/approvals/{pending.pk}").status_code == 200
    refused = [
        approver.post(f"/api/v1/approvals/{pending.pk}/approve", {}, format="json"),
        approver.post(f"/api/v1/approvals/{pending.pk}/deny", {"reason": "no"}, format="json"),
        approver.post(f"/api/v1/approvals/{pending.pk}/link"),
        admin.post(f"/api/v1/approvals/{pending.pk}/approve", {}, format="json"),
        admin.post("/api/v1/standing-approvals", {"workspace": "acme", "automation_id": automation_id,
                   "capability_id": "core.transform_data", "max_uses": 1, "expires_in_seconds": 60}, format="json"),
        admin.patch("/api/v1/workspaces/acme", {"four_eyes": False}, format="json"),
        admin.post("/api/v1/tokens", {"name": "escalate"}, format="json"),
        # Beyond the MCP tools' run and draft, no write: no raising an automation's autonomy.
        admin.patch(f"/api/v1/automations/{automation_id}", {"definition": definition(autonomy="A4")}, format="json"),
        admin.post(f"/api/v1/runs/{pending.run_id}/cancel"),
        admin.post("/api/v1/events", {"type": "x.y", "payload": {}}, format="json"),
    ]  # fmt: skip

    for response in refused:
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert Approval.objects.get(pk=pending.pk).status == ApprovalStatus.PENDING
    assert not StandingApproval.objects.exists()
    assert not ApiToken.objects.filter(name="escalate").exists()
    assert admin.post(f"/api/v1/automations/{automation_id}/run", {}, format="json").status_code == 202
    drafted = admin.post("/api/v1/drafts", {"workspace": "acme", "prompt": "say hi"}, format="json")
    assert drafted.json().get("error", {}).get("code") != "PERMISSION_DENIED", drafted.content
    assert Automation.objects.get(pk=automation_id).version == 1
    full = _as(api_token(people.alice)).post(f"/api/v1/approvals/{pending.pk}/approve", {}, format="json")
    assert full.status_code == 200
    assert full.json()["status"] == "approved"


def test_the_mcp_server_takes_only_mcp_tokens_and_they_cannot_approve(people, pending):
    assert user_for_token(api_token(people.alice)) is None  # a full token: refused
    user = user_for_token(api_token(people.alice, scope="mcp"))
    assert user is not None
    assert user.api_token_scope == "mcp"

    listed = tool_call(user=user, name="list_pending_approvals", arguments={})
    assert [a["id"] for a in listed["approvals"]] == [str(pending.pk)]
    assert not [name for name in TOOLS if "approve" in name or "deny" in name or "decide" in name]
    with pytest.raises(ServiceError) as refused:
        approval_decide(approval_id=pending.pk, user=user, decision="approve", via="mcp")
    assert (refused.value.code, refused.value.http_status) == ("PERMISSION_DENIED", 403)
    assert Approval.objects.get(pk=pending.pk).status == ApprovalStatus.PENDING


# --- admin ---------------------------------------------------------------------------------


def test_the_admin_lists_and_revokes_and_never_shows_a_token(owner):
    superuser = get_user_model().objects.create_superuser("root", password="pw")
    token = api_token(owner, name="laptop")
    browser = Client()
    browser.force_login(superuser)
    changelist = reverse("admin:workspaces_apitoken_changelist")

    page = browser.get(changelist)
    assert page.status_code == 200
    assert b"laptop" in page.content
    assert token[:12].encode() in page.content
    assert token.encode() not in page.content
    row = ApiToken.objects.get(user=owner, name="laptop")
    assert browser.get(reverse("admin:workspaces_apitoken_add")).status_code == 403
    browser.post(changelist, {"action": "revoke", "_selected_action": [row.pk]})

    assert not ApiToken.objects.filter(pk=row.pk).exists()
    assert _as(token).get(RUNS).status_code == 401


def test_staff_see_and_revoke_only_their_own_tokens_in_the_admin(owner, viewer):
    viewer.is_staff = True
    viewer.save(update_fields=["is_staff"])
    viewer.user_permissions.add(*AuthPermission.objects.all())
    browser = Client()
    browser.force_login(viewer)
    theirs, mine = api_token(owner, name="owners"), api_token(viewer, name="mine")
    changelist = reverse("admin:workspaces_apitoken_changelist")

    page = browser.get(changelist)
    owners = ApiToken.objects.get(name="owners")
    browser.post(changelist, {"action": "revoke", "_selected_action": [owners.pk]})

    assert b"mine" in page.content
    assert b"owners" not in page.content
    assert _as(theirs).get(RUNS).status_code == 200
    assert _as(mine).get(RUNS).status_code == 200
    assert browser.get(reverse("admin:workspaces_apitoken_change", args=[owners.pk])).status_code == 302


def test_the_token_up_prints_on_the_first_start_works_and_is_stored_hashed(db):
    bootstrap = platform_bootstrap()

    assert bootstrap is not None
    assert _as(bootstrap.api_token).get("/api/v1/workspaces").json()["results"] == [
        {"slug": "default", "name": "default", "role": "admin"}
    ]
    row = ApiToken.objects.get(user__username="admin")
    assert (row.name, row.scope, row.digest) == ("up", "full", token_digest(bootstrap.api_token))
    assert platform_bootstrap() is None  # a second start makes nothing
