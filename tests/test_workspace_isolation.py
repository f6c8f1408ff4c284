"""Every endpoint that names an object answers an outsider as if it did not exist.

One workspace (acme) owns one object of every kind; a member of another
workspace (globex, as its admin) tries every read and write on them and must
get 404, and every list must come back without acme's objects.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import Approval
from approvals.services import standing_approval_create
from audit.models import AuditEvent
from automations import executor, services
from capabilities.credentials import credential_create
from capabilities.mcp import mcp_server_create
from capabilities.models import McpTool
from tests.factories import api_token
from triggers.models import Trigger
from workspaces.models import Role
from workspaces.services import membership_set_role, workspace_get_or_create

pytestmark = pytest.mark.django_db


def _client(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user)}")
    return client


@pytest.fixture
def acme():
    """acme's objects: automation (with a webhook trigger), run awaiting approval, credential, MCP server+tool."""
    workspace = workspace_get_or_create(slug="acme")
    owner = get_user_model().objects.create_user("acme-owner")
    membership_set_role(workspace=workspace, user=owner, role=Role.ADMIN)
    automation = services.automation_create(workspace=workspace, user=owner, definition={
        "schema_version": "1.0", "name": "secret plan",
        "triggers": [{"key": "hook", "type": "webhook"}],
        "plan": [{"step_id": "ask", "action": "require_approval", "config": {"message": "ok?"}}],
    })  # fmt: skip
    run = services.run_create(automation=automation, inputs={}, user=owner).run
    executor.execute_run(str(run.pk))
    credential = credential_create(workspace=workspace, name="acme-api", kind="bearer", secret={"token": "s3cr3t-t0ken"},
                                   user=owner)  # fmt: skip
    server = mcp_server_create(
        workspace=workspace, slug="files", url="https://mcp.example.com/mcp", user=owner
    )
    tool = McpTool.objects.create(server=server, name="read", schema_hash="x", approved_hash="x", status="active",
                                  last_seen=timezone.now())  # fmt: skip
    standing = standing_approval_create(workspace=workspace, automation_id=automation.pk, capability_id="core.echo",
                                        max_uses=1, expires_at=timezone.now() + timedelta(days=1), user=owner)  # fmt: skip
    return {
        "automation": automation, "run": run, "trigger": Trigger.objects.get(automation=automation),
        "approval": Approval.objects.get(run_id=run.pk), "credential": credential, "server": server,
        "tool": tool, "standing": standing, "event": AuditEvent.objects.filter(workspace_id=workspace.id).last(),
    }  # fmt: skip


@pytest.fixture
def outsider():
    workspace = workspace_get_or_create(slug="globex")
    user = get_user_model().objects.create_user("globex-admin")
    membership_set_role(workspace=workspace, user=user, role=Role.ADMIN)
    return _client(user)


def object_endpoints(o):
    a, r, t, ap = o["automation"].pk, o["run"].pk, o["trigger"].pk, o["approval"].pk
    c, s, tool, st, ev = o["credential"].pk, o["server"].pk, o["tool"].pk, o["standing"].pk, o["event"].pk
    return [
        ("get", f"/api/v1/automations/{a}"), ("put", f"/api/v1/automations/{a}"),
        ("patch", f"/api/v1/automations/{a}"), ("delete", f"/api/v1/automations/{a}"),
        ("get", f"/api/v1/automations/{a}/versions"), ("post", f"/api/v1/automations/{a}/run"),
        ("get", f"/api/v1/automations/{a}/triggers"),
        ("get", f"/api/v1/runs/{r}"), ("post", f"/api/v1/runs/{r}/cancel"), ("post", f"/api/v1/runs/{r}/rerun"),
        ("post", f"/api/v1/runs/{r}/resolve"),
        ("post", f"/api/v1/triggers/{t}/rotate-token"), ("post", f"/api/v1/triggers/{t}/revoke-token"),
        ("post", f"/api/v1/triggers/{t}/rotate-signing-secret"),
        ("get", f"/api/v1/approvals/{ap}"), ("post", f"/api/v1/approvals/{ap}/approve"),
        ("post", f"/api/v1/approvals/{ap}/deny"), ("post", f"/api/v1/approvals/{ap}/link"),
        ("post", f"/api/v1/standing-approvals/{st}/revoke"),
        ("get", f"/api/v1/credentials/{c}"), ("delete", f"/api/v1/credentials/{c}"),
        ("post", f"/api/v1/credentials/{c}/secret"),
        ("get", f"/api/v1/mcp-servers/{s}"), ("patch", f"/api/v1/mcp-servers/{s}"),
        ("post", f"/api/v1/mcp-servers/{s}/harvest"), ("get", f"/api/v1/mcp-servers/{s}/tools"),
        ("get", f"/api/v1/mcp-tools/{tool}"), ("patch", f"/api/v1/mcp-tools/{tool}"),
        ("post", f"/api/v1/mcp-tools/{tool}/approve"),
        ("get", f"/api/v1/audit/{ev}"),
    ]  # fmt: skip


def test_every_object_endpoint_is_a_404_for_another_workspace(acme, outsider):
    before = {
        "status": acme["run"].__class__.objects.get(pk=acme["run"].pk).status,
        "approval": Approval.objects.get(pk=acme["approval"].pk).status,
        "token": Trigger.objects.get(pk=acme["trigger"].pk).token_hash,
    }
    for method, url in object_endpoints(acme):
        response = getattr(outsider, method)(url, {"reason": "x", "resolution": "failed"}, format="json")
        assert response.status_code == 404, (method, url, response.status_code, response.content[:200])
        assert response.json()["error"]["code"] == "NOT_FOUND"
        assert b"secret plan" not in response.content
        assert b"s3cr3t" not in response.content
    assert acme["run"].__class__.objects.get(pk=acme["run"].pk).status == before["status"]
    assert Approval.objects.get(pk=acme["approval"].pk).status == before["approval"]
    assert Trigger.objects.get(pk=acme["trigger"].pk).token_hash == before["token"]


@pytest.mark.parametrize("url", [
    "/api/v1/automations", "/api/v1/runs", "/api/v1/approvals", "/api/v1/standing-approvals",
    "/api/v1/credentials", "/api/v1/mcp-servers", "/api/v1/audit", "/api/v1/capabilities",
])  # fmt: skip
def test_lists_never_show_another_workspace(acme, outsider, url):
    response = outsider.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    for obj in ("automation", "run", "approval", "standing"):  # UUIDs: unique enough to search for
        assert str(acme[obj].pk) not in body
    assert "secret plan" not in body
    assert "files.read" not in body
    assert "acme" not in body
    if url in ("/api/v1/credentials", "/api/v1/mcp-servers"):
        assert response.json()["count"] == 0


def test_trace_of_another_workspace_is_empty(acme, outsider):
    response = outsider.get(f"/api/v1/audit?trace_id={acme['run'].trace_id}")
    assert response.status_code == 200
    assert response.json()["results"] == []
