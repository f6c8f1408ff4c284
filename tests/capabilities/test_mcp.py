"""MCP servers and tools against a real MCP server (the SDK's MCPServer) over streamable HTTP and stdio.

Runs are driven in-process with the real executor (``execute_run`` is what the
Celery task calls), so every step goes through rendering, validation, the
gate, the handler and redaction exactly as on a worker.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from approvals.models import Approval
from approvals.services import approval_decide, approvals_expire
from audit.models import AuditEvent
from automations import executor
from automations import services as engine
from automations.models import Run, RunStatus, StepRun
from capabilities import credentials, mcp, registry, tasks
from capabilities.base import ErrorCode, Risk, SideEffect
from capabilities.models import McpServer, McpTool, McpToolStatus
from tests.factories import client_for, harvest_approved
from workspaces.models import Workspace

pytestmark = pytest.mark.django_db

SECRET = "mcp-secret-4c1d9e8f7a6b"
TOOLS = {"read_file", "write_note", "slow_note", "delete_note", "echo_secret", "fail"}


# --- helpers ---------------------------------------------------------------------------


def _http(workspace, server, slug="files", credential=None) -> McpServer:
    return mcp.mcp_server_create(workspace=workspace, slug=slug, transport="http", url=server.url,
                                 credential=credential)  # fmt: skip


def _stdio(workspace, command, tmp_path, slug="local", credential=None, env=None) -> McpServer:
    env = {"MCP_TEST_NOTES": str(tmp_path / "stdio-notes.txt"), **(env or {})}
    return mcp.mcp_server_create(workspace=workspace, slug=slug, transport="stdio", command=command, env=env,
                                 credential=credential)  # fmt: skip


def _call(step_id, capability, args=None, **extra) -> dict:
    return {"step_id": step_id, "action": "call_capability",
            "config": {"capability": capability, "args": args or {}}, **extra}  # fmt: skip


def _automation(workspace, owner, *steps, autonomy="A4", name="mcp test", **execution):
    # An MCP tool is high risk: at A4 it runs, once the workspace's admin lets A4 through (max_autonomy).
    Workspace.objects.filter(pk=workspace.pk).update(max_autonomy="A4")
    definition = {"schema_version": "1.0", "name": name, "plan": list(steps),
                  "execution": {"autonomy": autonomy, **execution}}  # fmt: skip
    return engine.automation_create(workspace=workspace, definition=definition, user=owner)


def _start(automation, owner) -> Run:
    return engine.run_create(automation=automation, inputs={}, user=owner).run


def _step(run, step_id) -> StepRun:
    return StepRun.objects.get(run=run, step_id=step_id)


def _tool(name, slug="files") -> McpTool:
    return McpTool.objects.get(server__slug=slug, name=name)


def _audit_dump() -> str:
    rows = AuditEvent.objects.values_list("type", "summary", "payload", "refs", "actor")
    return json.dumps([list(row) for row in rows])


# --- harvest ---------------------------------------------------------------------------


def test_harvest_over_http_records_untrusted_tools(workspace, mcp_http):
    server = _http(workspace, mcp_http)

    result = mcp.mcp_harvest(server)

    assert sorted(result.new) == sorted(TOOLS)
    tools = McpTool.objects.filter(server=server)
    assert {t.name for t in tools} == TOOLS
    for tool in tools:
        assert tool.status == McpToolStatus.PENDING  # nobody approved it yet
        assert tool.approved_hash == ""
        assert tool.risk_override is None
    read = _tool("read_file")
    assert read.description == "Read a text file and return its content."
    assert read.input_schema["properties"]["path"]["type"] == "string"
    assert read.annotations["readOnlyHint"] is True
    server.refresh_from_db()
    assert server.last_harvested_at is not None
    assert server.last_error == ""
    assert AuditEvent.objects.filter(type="mcp.tool.added").count() == len(TOOLS)
    assert AuditEvent.objects.get(type="mcp.server.harvested").payload["new"] == len(TOOLS)

    again = mcp.mcp_harvest(server)
    assert again.counts() == {"new": 0, "changed": 0, "removed": 0, "restored": 0, "unchanged": len(TOOLS)}
    assert set(McpTool.objects.filter(server=server).values_list("status", flat=True)) == {
        McpToolStatus.PENDING
    }


def test_harvest_over_stdio_records_tools(workspace, stdio_command, tmp_path):
    server = _stdio(workspace, stdio_command, tmp_path)

    result = harvest_approved(server)

    assert sorted(result.new) == sorted(TOOLS)
    assert set(McpTool.objects.filter(server=server).values_list("name", flat=True)) == TOOLS


def test_harvested_tools_are_high_risk_capabilities_in_the_api(workspace, mcp_http, api):
    harvest_approved(_http(workspace, mcp_http))

    response = api.get("/api/v1/capabilities")

    assert response.status_code == 200
    by_id = {c["id"]: c for c in response.json()["results"] if c["workspace"] == "acme"}
    assert {f"files.{name}" for name in TOOLS} <= set(by_id)
    read, write = by_id["files.read_file"], by_id["files.write_note"]
    assert read["risk"] == write["risk"] == "high"
    assert read["side_effects"] == ["read"]
    assert read["idempotent"] is True
    assert write["side_effects"] == ["external_write"]
    assert write["idempotent"] is False
    assert read["input_schema"]["required"] == ["path"]


def test_capability_lookup_is_scoped_to_the_workspace(workspace, other_workspace, mcp_http):
    harvest_approved(_http(workspace, mcp_http))

    capability = registry.get_capability("files.read_file", workspace.id)
    assert capability is not None
    assert capability.risk == Risk.HIGH
    assert capability.side_effects == frozenset({SideEffect.READ})
    assert registry.get_capability("files.read_file", other_workspace.id) is None
    assert registry.get_capability("files.nope", workspace.id) is None
    assert registry.get_capability("files", workspace.id) is None


def test_the_harvest_task_reconciles_every_enabled_server(workspace, mcp_http):
    _http(workspace, mcp_http)
    disabled = _http(workspace, mcp_http, slug="off")
    mcp.mcp_server_update(server=disabled, enabled=False)

    assert tasks.harvest_mcp_servers() == {"harvested": 1, "failed": 0}
    assert not McpTool.objects.filter(server=disabled).exists()


def test_a_private_mcp_url_needs_the_egress_allowlist(workspace, mcp_http, settings):
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []
    workspace.egress_allowlist = []
    workspace.save(update_fields=["egress_allowlist"])
    server = _http(workspace, mcp_http)

    with pytest.raises(mcp.McpServiceError) as caught:
        harvest_approved(server)

    assert caught.value.code == ErrorCode.POLICY_VIOLATION
    server.refresh_from_db()
    assert "not allowed" in server.last_error
    assert AuditEvent.objects.filter(type="mcp.server.harvest_failed").exists()


# --- calling tools through the engine -----------------------------------------------------


def test_read_tool_runs_through_the_engine_over_http(workspace, owner, mcp_http, tmp_path, drive):
    harvest_approved(_http(workspace, mcp_http))
    document = tmp_path / "doc.txt"
    document.write_text("hello from the file")
    automation = _automation(workspace, owner, _call("read", "files.read_file", {"path": str(document)}))

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.SUCCEEDED, run.error
    step = _step(run, "read")
    assert step.output["ok"] is True
    assert step.output["data"] == {"result": "hello from the file"}
    assert run.output == {"result": "hello from the file"}


def test_tools_run_through_the_engine_over_stdio(workspace, owner, stdio_command, tmp_path, drive):
    harvest_approved(_stdio(workspace, stdio_command, tmp_path))
    document = tmp_path / "doc.txt"
    document.write_text("stdio content")
    automation = _automation(
        workspace, owner,
        _call("read", "local.read_file", {"path": str(document)}, output_as="doc"),
        _call("note", "local.write_note", {"text": "{{ doc.result }}"}),
    )  # fmt: skip

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert _step(run, "read").output["data"] == {"result": "stdio content"}
    assert run.output == {"written": True, "count": 1}
    assert (tmp_path / "stdio-notes.txt").read_text() == "stdio content\n"


def test_args_are_validated_against_the_tool_schema_before_calling(workspace, owner, mcp_http):
    harvest_approved(_http(workspace, mcp_http))

    with pytest.raises(engine.DefinitionInvalid) as caught:
        _automation(workspace, owner, _call("read", "files.read_file", {"path": 42}))
    assert caught.value.errors[0]["path"] == "/plan/0/config/args/path"


def test_a_changed_tool_is_disabled_audited_and_not_callable(workspace, owner, own_mcp_http, tmp_path, drive):
    server = _http(workspace, own_mcp_http)
    harvest_approved(server)
    document = tmp_path / "doc.txt"
    document.write_text("content")
    automation = _automation(workspace, owner, _call("read", "files.read_file", {"path": str(document)}))

    own_mcp_http.restart(variant="changed")
    result = harvest_approved(server)

    assert result.changed == ["read_file"]
    tool = _tool("read_file")
    assert tool.status == McpToolStatus.DISABLED
    assert tool.changed_since_approval
    assert "id_rsa" in tool.description
    event = AuditEvent.objects.get(type="mcp.tool.changed")
    assert event.outcome == "failure"
    assert event.payload["previous_description"] == "Read a text file and return its content."
    assert registry.get_capability("files.read_file", workspace.id) is None
    assert "files.read_file" not in {c.id for c in registry.list_capabilities(workspace.id)}

    run = drive(_start(automation, owner).pk)
    assert run.status == RunStatus.FAILED
    # It exists but is held back: a policy matter, not a missing capability.
    assert _step(run, "read").error_code == ErrorCode.POLICY_VIOLATION
    assert "tool changed since approval; an admin must re-approve it" in _step(run, "read").error_message

    mcp.mcp_tool_approve(tool=tool, user=owner)  # an admin reviewed the new description
    run = drive(_start(automation, owner).pk)
    assert run.status == RunStatus.SUCCEEDED, run.error
    assert (
        AuditEvent.objects.filter(type="mcp.tool.approved", summary__contains="read_file").count() == 2
    )  # first + re


def test_a_tool_changed_since_the_last_harvest_is_refused_at_call_time(
    workspace, owner, own_mcp_http, tmp_path, drive
):
    harvest_approved(_http(workspace, own_mcp_http))
    document = tmp_path / "doc.txt"
    document.write_text("content")
    automation = _automation(workspace, owner, _call("read", "files.read_file", {"path": str(document)}))

    own_mcp_http.restart(variant="changed")  # no harvest in between
    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.FAILED
    step = _step(run, "read")
    assert step.error_code == ErrorCode.POLICY_VIOLATION
    assert "tool changed since approval; an admin must re-approve it" in step.error_message
    assert _tool("read_file").status == McpToolStatus.DISABLED
    assert AuditEvent.objects.filter(type="mcp.tool.changed", trace_id=run.trace_id).exists()


def test_a_step_approved_before_its_tool_was_rug_pulled_fails_as_policy_and_settles_its_approval(
    workspace, owner, own_mcp_http, tmp_path, drive
):
    server = _http(workspace, own_mcp_http)
    harvest_approved(server)
    document = tmp_path / "doc.txt"
    document.write_text("content")
    automation = _automation(workspace, owner, _call("read", "files.read_file", {"path": str(document)}),
                             autonomy="A2")  # fmt: skip
    run = drive(_start(automation, owner).pk)
    assert run.status == RunStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(run_id=run.pk)
    approval_decide(approval_id=approval.pk, user=owner, decision="approve")

    own_mcp_http.restart(variant="changed")  # the tool changes while the approved run waits
    harvest_approved(server)
    engine.run_resume(run_id=str(run.pk))
    run = drive(run.pk)

    assert run.status == RunStatus.FAILED
    step = _step(run, "read")
    assert step.error_code == ErrorCode.POLICY_VIOLATION
    assert "tool changed since approval; an admin must re-approve it" in step.error_message
    approval.refresh_from_db()
    assert approval.settled_at is not None
    assert approval.status == "invalidated"
    later = approval.decided_at + timedelta(minutes=5)
    assert approvals_expire(now=later) == {"expired": 0, "nudged": 0}


def test_a_tool_no_longer_offered_is_marked_removed_not_deleted(workspace, owner, own_mcp_http):
    server = _http(workspace, own_mcp_http)
    harvest_approved(server)

    own_mcp_http.restart(variant="fewer")
    result = harvest_approved(server)

    assert sorted(result.removed) == ["slow_note", "write_note"]
    assert _tool("write_note").status == McpToolStatus.REMOVED
    assert registry.get_capability("files.write_note", workspace.id) is None
    assert AuditEvent.objects.filter(type="mcp.tool.removed").count() == 2
    with pytest.raises(mcp.McpServiceError):
        mcp.mcp_tool_approve(tool=_tool("write_note"), user=owner)

    own_mcp_http.restart()
    assert sorted(harvest_approved(server).restored) == ["slow_note", "write_note"]
    assert _tool("write_note").status == McpToolStatus.ACTIVE


def test_server_down_is_temporarily_unavailable_and_retried(workspace, owner, own_mcp_http, tmp_path, drive):
    harvest_approved(_http(workspace, own_mcp_http))
    automation = _automation(workspace, owner, _call("note", "files.write_note", {"text": "x"}),
                             max_retries=2, retry_backoff="none")  # fmt: skip
    own_mcp_http.stop()

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.FAILED
    step = _step(run, "note")
    assert step.error_code == ErrorCode.TEMPORARILY_UNAVAILABLE
    assert step.attempt == 3  # the first try and max_retries=2 retries
    assert step.output["error"]["retryable"] is True
    assert "could not reach the MCP server files" in step.error_message
    assert AuditEvent.objects.filter(trace_id=run.trace_id, type="step.retrying").count() == 2
    assert AuditEvent.objects.filter(trace_id=run.trace_id, type="mcp.call.failed").count() == 3
    assert own_mcp_http.notes_written() == []


def test_a_write_that_times_out_after_it_was_sent_is_outcome_unknown(workspace, owner, own_mcp_http, drive):
    harvest_approved(_http(workspace, own_mcp_http))
    step = _call("note", "files.slow_note", {"text": "late", "seconds": 3}, timeout_seconds=1, max_retries=3)
    automation = _automation(workspace, owner, step)

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.FAILED
    step_run = _step(run, "note")
    assert step_run.error_code == ErrorCode.OUTCOME_UNKNOWN
    assert step_run.attempt == 1  # never retried: it may have happened
    assert step_run.output["error"]["retryable"] is False


def test_a_tool_error_is_reported_safely(workspace, owner, mcp_http, drive):
    harvest_approved(_http(workspace, mcp_http))
    automation = _automation(workspace, owner, _call("boom", "files.fail", {"reason": "disk full"}))

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.FAILED
    step = _step(run, "boom")
    assert step.error_code == ErrorCode.INVALID_ARGUMENT
    assert step.error_message == "the MCP tool files.fail reported an error"
    assert "/srv/secret/path" not in json.dumps(step.output)
    assert "/srv/secret/path" not in json.dumps(run.error)
    event = AuditEvent.objects.get(type="mcp.tool.error", trace_id=run.trace_id)
    assert "disk full" in event.payload["text"]  # the raw text is kept for operators


def test_disabled_server_tools_are_not_found(workspace, owner, mcp_http):
    server = _http(workspace, mcp_http)
    harvest_approved(server)
    mcp.mcp_server_update(server=server, enabled=False)

    assert registry.get_capability("files.read_file", workspace.id) is None


# --- credentials end to end ------------------------------------------------------------


class _Echo(BaseHTTPRequestHandler):
    """Answers every request with the headers it received (a worst-case API that reflects secrets)."""

    def do_GET(self):
        body = json.dumps(
            {"headers": dict(self.headers), "note": f"you sent {self.headers.get('Authorization')}"}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Echo-Auth", self.headers.get("Authorization", ""))
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/echo"
    server.shutdown()
    server.server_close()


def test_credential_values_echoed_back_are_redacted_everywhere(
    workspace, owner, mcp_http, stdio_command, tmp_path, echo_server, drive
):
    credential = credentials.credential_create(workspace=workspace, name="mcp-token", kind="bearer",
                                               secret={"token": SECRET}, user=owner,
                                               allowed_destinations=["127.0.0.1"])  # fmt: skip
    harvest_approved(_http(workspace, mcp_http, credential=credential))
    harvest_approved(_stdio(workspace, stdio_command, tmp_path, credential=credential,
                           env={"MCP_TEST_TOKEN": "$credential"}))  # fmt: skip
    automation = _automation(
        workspace, owner,
        _call("over_http", "files.echo_secret", output_as="http_echo"),
        _call("over_stdio", "local.echo_secret", output_as="stdio_echo"),
        {"step_id": "api", "action": "http_request", "output_as": "api",
         "config": {"url": echo_server, "credential": "mcp-token"}},
        {"step_id": "all", "action": "transform_data",
         "config": {"output": {"http": "{{ http_echo.authorization }}", "stdio": "{{ stdio_echo.env }}",
                               "api": "{{ api.body.note }}"}}},
    )  # fmt: skip

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.SUCCEEDED, run.error
    # The secret really went out (the servers saw it) and came back redacted.
    assert _step(run, "over_http").output["data"]["authorization"] == "Bearer [REDACTED]"
    assert _step(run, "over_stdio").output["data"]["env"] == "[REDACTED]"
    assert _step(run, "api").output["data"]["body"]["headers"]["Authorization"] == "Bearer [REDACTED]"
    assert run.output == {
        "http": "Bearer [REDACTED]",
        "stdio": "[REDACTED]",
        "api": "you sent Bearer [REDACTED]",
    }
    stored = json.dumps([list(row) for row in StepRun.objects.filter(run=run).values_list(
        "output", "rendered_config", "error_message")])  # fmt: skip
    assert SECRET not in stored
    assert SECRET not in json.dumps(Run.objects.filter(pk=run.pk).values("output", "error", "context").get())
    assert SECRET not in _audit_dump()
    assert AuditEvent.objects.filter(trace_id=run.trace_id).count() > 5


def test_a_workspace_cannot_use_another_workspaces_credential(workspace, other_workspace, owner, outsider,
                                                              mcp_http, drive):  # fmt: skip
    credential = credentials.credential_create(workspace=workspace, name="mcp-token", kind="bearer",
                                               secret={"token": SECRET})  # fmt: skip
    with pytest.raises(mcp.McpServiceError):
        _http(other_workspace, mcp_http, credential=credential)

    harvest_approved(_http(other_workspace, mcp_http))
    step = {"step_id": "api", "action": "http_request",
            "config": {"url": mcp_http.url, "credential": "{{ 'mcp-token' }}"}}  # fmt: skip
    automation = _automation(other_workspace, outsider, step)
    run = drive(_start(automation, outsider).pk)

    assert run.status == RunStatus.FAILED
    assert _step(run, "api").error_code == ErrorCode.INVALID_ARGUMENT
    assert "no credential named 'mcp-token'" in _step(run, "api").error_message


def test_stdio_credentials_must_be_passed_through_declared_env(workspace, stdio_command, tmp_path):
    credential = credentials.credential_create(workspace=workspace, name="tok", kind="bearer",
                                               secret={"token": SECRET})  # fmt: skip
    with pytest.raises(mcp.McpServiceError, match=r"\$credential"):
        _stdio(workspace, stdio_command, tmp_path, credential=credential)
    with pytest.raises(mcp.McpServiceError, match="no credential"):
        _stdio(workspace, stdio_command, tmp_path, env={"MCP_TEST_TOKEN": "$credential"})


# --- the approval gate -------------------------------------------------------------------


def test_write_tool_is_gated_then_approved_and_runs_exactly_once(workspace, owner, mcp_http, drive):
    harvest_approved(_http(workspace, mcp_http))
    automation = _automation(workspace, owner, _call("note", "files.write_note", {"text": "approved write"}),
                             autonomy="A3")  # fmt: skip

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert mcp_http.notes_written() == []  # nothing ran before the approval
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.risk == "high"
    approval_decide(approval_id=approval.pk, user=owner, decision="approve")
    engine.run_resume(run_id=str(run.pk))
    run = drive(run.pk)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == {"written": True, "count": 1}
    engine.run_resume(run_id=str(run.pk))  # a duplicate resume message changes nothing
    executor.execute_run(str(run.pk))
    assert mcp_http.notes_written() == ["approved write"]


def test_a_risk_override_changes_the_gate(workspace, owner, mcp_http, drive):
    harvest_approved(_http(workspace, mcp_http))
    mcp.mcp_tool_set_risk(tool=_tool("write_note"), risk="low", user=owner)
    automation = _automation(workspace, owner, _call("note", "files.write_note", {"text": "trusted"}),
                             autonomy="A3")  # fmt: skip

    run = drive(_start(automation, owner).pk)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert mcp_http.notes_written() == ["trusted"]
    assert AuditEvent.objects.get(type="mcp.tool.risk_set").payload["risk_override"] == "low"


# --- API -------------------------------------------------------------------------------


def test_api_register_harvest_list_approve_and_set_risk(api, workspace, own_mcp_http):
    created = api.post("/api/v1/mcp-servers", {"slug": "files", "url": own_mcp_http.url}, format="json")
    assert created.status_code == 201, created.content
    server_id = created.json()["id"]

    harvested = api.post(f"/api/v1/mcp-servers/{server_id}/harvest")
    assert harvested.status_code == 200
    assert harvested.json()["new"] == len(TOOLS)

    tools = api.get(f"/api/v1/mcp-servers/{server_id}/tools").json()
    assert tools["count"] == len(TOOLS)
    read = next(t for t in tools["results"] if t["name"] == "read_file")
    assert read["capability_id"] == "files.read_file"
    assert read["risk"] == "high"
    assert read["status"] == "pending"  # new: waits for an admin
    assert api.post(f"/api/v1/mcp-tools/{read['id']}/approve").json()["status"] == "active"

    patched = api.patch(f"/api/v1/mcp-tools/{read['id']}", {"risk_override": "low"}, format="json")
    assert patched.status_code == 200
    assert patched.json()["risk"] == "low"
    assert registry.get_capability("files.read_file", workspace.id).risk == Risk.LOW

    own_mcp_http.restart(variant="changed")
    assert api.post(f"/api/v1/mcp-servers/{server_id}/harvest").json()["changed"] == 1
    assert api.get(f"/api/v1/mcp-tools/{read['id']}").json()["status"] == "disabled"
    approved = api.post(f"/api/v1/mcp-tools/{read['id']}/approve")
    assert approved.status_code == 200
    assert approved.json()["status"] == "active"
    assert approved.json()["changed_since_approval"] is False


def test_api_harvest_failure_is_a_clean_error(api, workspace, own_mcp_http):
    server = _http(workspace, own_mcp_http)
    own_mcp_http.stop()

    response = api.post(f"/api/v1/mcp-servers/{server.pk}/harvest")

    assert response.status_code == 502
    assert response.json() == {"error": {"code": "TEMPORARILY_UNAVAILABLE",
                                         "message": "could not reach the MCP server files"}}  # fmt: skip


def test_api_roles_and_workspace_isolation(workspace, owner, viewer, outsider, mcp_http):
    server = _http(workspace, mcp_http)
    harvest_approved(server)
    tool = _tool("read_file")

    as_viewer = client_for(viewer)
    assert as_viewer.get("/api/v1/mcp-servers").json()["count"] == 1
    assert as_viewer.post(f"/api/v1/mcp-servers/{server.pk}/harvest").status_code == 403
    assert as_viewer.post(f"/api/v1/mcp-tools/{tool.pk}/approve").status_code == 403
    assert as_viewer.post("/api/v1/mcp-servers", {"slug": "x", "url": mcp_http.url, "workspace": "acme"},
                          format="json").status_code == 403  # fmt: skip

    as_outsider = client_for(outsider)
    assert as_outsider.get("/api/v1/mcp-servers").json()["count"] == 0
    assert as_outsider.post(f"/api/v1/mcp-servers/{server.pk}/harvest").status_code == 404
    assert as_outsider.get(f"/api/v1/mcp-servers/{server.pk}/tools").status_code == 404
    assert as_outsider.patch(f"/api/v1/mcp-tools/{tool.pk}", {"risk_override": "low"},
                             format="json").status_code == 404  # fmt: skip
    assert _tool("read_file").risk_override is None


def test_api_stdio_servers_need_a_superuser(api, workspace, owner, stdio_command):
    body = {"slug": "local", "transport": "stdio", "command": stdio_command}
    refused = api.post("/api/v1/mcp-servers", body, format="json")
    assert refused.status_code == 403
    assert not McpServer.objects.exists()

    owner.is_superuser = True
    owner.save(update_fields=["is_superuser"])
    assert api.post("/api/v1/mcp-servers", body, format="json").status_code == 201


def test_api_rejects_invalid_servers(api, workspace):
    for body, path in [
        ({"slug": "Bad.Slug", "url": "http://127.0.0.1/mcp"}, "/slug"),
        ({"slug": "core", "url": "http://127.0.0.1/mcp"}, "/slug"),
        ({"slug": "files", "url": "ftp://example.com"}, "/url"),
        ({"slug": "files", "url": "http://127.0.0.1/mcp", "credential": "missing"}, "/credential"),
    ]:
        response = api.post("/api/v1/mcp-servers", body, format="json")
        assert response.status_code == 400, body
        assert response.json()["errors"][0]["path"] == path


# --- admin -----------------------------------------------------------------------------


def test_admin_harvests_reapproves_and_sets_risk(admin_client, workspace, own_mcp_http):
    server = _http(workspace, own_mcp_http)
    changelist = "/admin/capabilities/mcpserver/"

    harvested = admin_client.post(
        changelist, {"action": "harvest_now", "_selected_action": [server.pk]}, follow=True
    )
    assert harvested.status_code == 200
    assert McpTool.objects.filter(server=server).count() == len(TOOLS)
    review = admin_client.get("/admin/capabilities/mcptool/?review=yes").content.decode()
    assert "files.write_note" in review  # new tools wait for review
    assert "PENDING" in review
    every = list(McpTool.objects.filter(server=server).values_list("pk", flat=True))
    admin_client.post("/admin/capabilities/mcptool/", {"action": "reapprove", "_selected_action": every})
    assert set(McpTool.objects.filter(server=server).values_list("status", flat=True)) == {
        McpToolStatus.ACTIVE
    }

    own_mcp_http.restart(variant="changed")
    admin_client.post(changelist, {"action": "harvest_now", "_selected_action": [server.pk]})
    tool = _tool("read_file")
    assert tool.status == McpToolStatus.DISABLED
    review = admin_client.get("/admin/capabilities/mcptool/?review=yes").content.decode()
    assert "files.read_file" in review
    assert "DISABLED" in review
    assert "files.write_note" not in review

    tools = "/admin/capabilities/mcptool/"
    admin_client.post(tools, {"action": "reapprove", "_selected_action": [tool.pk]})
    admin_client.post(tools, {"action": "risk_medium", "_selected_action": [tool.pk]})
    tool.refresh_from_db()
    assert tool.status == McpToolStatus.ACTIVE
    assert tool.risk_override == "medium"
    assert registry.get_capability("files.read_file", workspace.id).risk == Risk.MEDIUM
    assert AuditEvent.objects.filter(type="mcp.tool.approved", actor="user:root").exists()
    assert admin_client.get(f"/admin/capabilities/mcpserver/{server.pk}/change/").status_code == 200
    assert admin_client.get(f"/admin/capabilities/mcptool/{tool.pk}/change/").status_code == 200


def test_admin_adds_an_http_server(admin_client, workspace, mcp_http):
    response = admin_client.post(
        "/admin/capabilities/mcpserver/add/",
        {"workspace": workspace.pk, "slug": "files", "name": "Files", "transport": "http", "url": mcp_http.url,
         "command": "[]", "env": "{}", "enabled": "on"},
    )  # fmt: skip
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert McpServer.objects.get(slug="files").url == mcp_http.url
    assert AuditEvent.objects.filter(type="mcp.server.created", actor="user:root").exists()


# --- failure classification (no server needed) -------------------------------------------


def _classify(phase, *errors, status=None, read_only=False):
    from capabilities import mcp_client, mcp_sdk

    probe = mcp_sdk._Probe(phase=phase, statuses={phase: status} if status else {})
    conn = mcp_client.Connection(label="files", transport="http", timeout=5)
    return mcp_sdk._classify(ExceptionGroup("transport", list(errors)), probe, conn, read_only=read_only)


def test_failure_classification():
    import httpx2
    from mcp.shared.exceptions import MCPError
    from mcp_types import CONNECTION_CLOSED, INVALID_PARAMS, REQUEST_TIMEOUT

    unavailable, unknown = ErrorCode.TEMPORARILY_UNAVAILABLE, ErrorCode.OUTCOME_UNKNOWN
    cases = [
        (_classify("connect", httpx2.ConnectError("refused")), unavailable, True),
        (
            _classify("list", MCPError(-32603, "Server returned an error response"), status=503),
            unavailable,
            True,
        ),
        (_classify("connect", MCPError(-32603, "x"), status=401), ErrorCode.INVALID_ARGUMENT, False),
        (_classify("call", httpx2.ConnectError("refused")), unavailable, True),
        (
            _classify("call", MCPError(-32603, "Server returned an error response"), status=502),
            unavailable,
            True,
        ),
        (_classify("call", httpx2.ReadTimeout("slow")), unknown, False),
        (_classify("call", httpx2.ReadTimeout("slow"), read_only=True), ErrorCode.TIMEOUT, True),
        (_classify("call", MCPError(REQUEST_TIMEOUT, "timed out")), unknown, False),
        (_classify("call", httpx2.RemoteProtocolError("dropped")), unknown, False),
        (_classify("call", MCPError(CONNECTION_CLOSED, "Connection closed")), unknown, False),
        (_classify("call", MCPError(CONNECTION_CLOSED, "closed"), read_only=True), unavailable, True),
        (_classify("call", MCPError(INVALID_PARAMS, "bad /etc/passwd")), ErrorCode.INVALID_ARGUMENT, False),
    ]
    for error, code, retryable in cases:
        assert (error.code, error.retryable) == (code, retryable), error.message
        assert "/etc/passwd" not in error.message
    assert "bad /etc/passwd" in cases[-1][0].detail


def test_the_sdk_runs_even_inside_a_running_event_loop():
    import asyncio

    from capabilities import mcp_sdk

    async def inner() -> int:
        return 7

    async def outer() -> int:
        return mcp_sdk.run_async(inner)

    assert asyncio.run(outer()) == 7


def test_a_new_tool_on_a_known_server_waits_for_an_admin(workspace, owner, own_mcp_http, drive, api):
    """A tool that appears on a server already trusted is pending: not callable, not offered to agents,
    drafting or glob allowlists, until an admin approves it."""
    from automations.authoring.context import registry_digest
    from capabilities import tools as agent_tools

    own_mcp_http.restart(variant="fewer")  # no write_note yet
    server = _http(workspace, own_mcp_http)
    harvest_approved(server)
    own_mcp_http.restart()

    result = mcp.mcp_harvest(server)

    assert sorted(result.new) == ["slow_note", "write_note"]
    tool = _tool("write_note")
    assert tool.status == McpToolStatus.PENDING
    assert AuditEvent.objects.filter(
        type="mcp.tool.added", summary__contains="write_note discovered: pending"
    ).exists()
    assert registry.get_capability("files.write_note", workspace.id) is None
    assert "files.write_note" not in {c["id"] for c in registry_digest(workspace.id)["capabilities"]}
    assert "files.write_note" not in {
        t.id for t in agent_tools.tools_matching(["files.*", "*"], workspace.id)
    }
    assert "files.read_file" in {t.id for t in agent_tools.tools_matching(["files.*"], workspace.id)}
    listed = api.get(f"/api/v1/mcp-servers/{server.pk}/tools").json()["results"]
    assert {t["name"]: t["status"] for t in listed}["write_note"] == "pending"
    with pytest.raises(engine.DefinitionInvalid):
        _automation(workspace, owner, _call("note", "files.write_note", {"text": "x"}))

    approved = api.post(f"/api/v1/mcp-tools/{tool.pk}/approve")

    assert approved.status_code == 200, approved.content
    assert approved.json()["status"] == "active"
    automation = _automation(workspace, owner, _call("note", "files.write_note", {"text": "now trusted"}))
    assert drive(_start(automation, owner).pk).status == RunStatus.SUCCEEDED
    assert own_mcp_http.notes_written() == ["now trusted"]


def test_a_pending_tool_that_changes_stays_pending(workspace, own_mcp_http):
    server = _http(workspace, own_mcp_http)
    mcp.mcp_harvest(server)
    own_mcp_http.restart(variant="changed")

    assert mcp.mcp_harvest(server).changed == ["read_file"]

    assert _tool("read_file").status == McpToolStatus.PENDING
    assert registry.get_capability("files.read_file", workspace.id) is None
