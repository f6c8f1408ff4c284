"""``manage.py mcp_serve`` end to end with the official ``mcp`` client SDK, over stdio
(spawned by the client, token in the environment) and streamable HTTP (bearer token),
against a real Celery worker: list the tools, run an automation, follow the run until
it succeeds, list the approval a gated run waits for; roles, isolation and bad tokens."""

from __future__ import annotations

import io
import socket
import sys
import time
from contextlib import redirect_stdout
from datetime import timedelta
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from automations.models import Run
from tests import live
from tests.factories import api_token
from workspaces.api_tokens import token_digest
from workspaces.models import ApiToken

from .test_tools import EXPECTED_TOOLS

pytestmark = pytest.mark.workers

DEADLINE = 90.0  # seconds: generous for a loaded 2-core machine; every wait is a poll for a condition


def structured(result) -> dict[str, Any]:
    assert result.structured_content is not None, result
    return result.structured_content


async def wait_for_status(client: Client, run_id: str, statuses: set[str]) -> dict[str, Any]:
    with anyio.fail_after(DEADLINE):
        while True:
            run = structured(await client.call_tool("get_run", {"run_id": run_id}))
            if run["status"] in statuses:
                return run
            await anyio.sleep(0.1)


async def look_fire_follow(client: Client, greet, gated) -> None:
    """The whole story a model can tell: look, fire, follow, see what waits for a human."""
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == EXPECTED_TOOLS
    assert tools["get_run"].annotations.read_only_hint is True
    assert tools["run_automation"].annotations.idempotent_hint is False
    assert not any(tool.annotations.destructive_hint for tool in tools.values())

    listed = structured(await client.call_tool("list_automations", {}))
    assert sorted(a["name"] for a in listed["automations"]) == ["gated", "greet"]

    args = {"automation_id": str(greet.pk), "inputs": {"who": "mcp"}, "idempotency_key": "once"}
    started = structured(await client.call_tool("run_automation", args))
    again = structured(await client.call_tool("run_automation", args))
    assert again["run_id"] == started["run_id"]
    assert again["deduplicated"] is True
    run = await wait_for_status(client, started["run_id"], {"succeeded", "failed"})
    assert run["status"] == "succeeded"
    assert run["output"] == {"greeting": "hi mcp"}

    waiting = structured(await client.call_tool("run_automation", {"automation_id": str(gated.pk)}))
    await wait_for_status(client, waiting["run_id"], {"awaiting_approval"})
    pending = structured(await client.call_tool("list_pending_approvals", {"run_id": waiting["run_id"]}))
    assert [a["step_id"] for a in pending["approvals"]] == ["careful"]

    with pytest.raises(MCPError):
        await client.call_tool("approve", {"approval_id": pending["approvals"][0]["id"]})


# --- stdio ----------------------------------------------------------------------------------


def test_stdio_look_fire_and_follow(celery_workers, operator, greet, gated, token_of):
    params = stdio_params(token_of(operator))

    async def main() -> None:
        # mode="legacy": the initialize handshake desktop clients use.
        async with Client(
            stdio_client(params), mode="legacy", cache=None, read_timeout_seconds=DEADLINE
        ) as client:
            await look_fire_follow(client, greet, gated)

    anyio.run(main)


def stdio_params(token: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable, args=["manage.py", "mcp_serve"], cwd=str(live.REPO),
        env=live.live_worker_env(AUTOPLANE_API_TOKEN=token),
    )  # fmt: skip


def test_stdio_a_viewer_reads_but_cannot_run(transactional_db, viewer, greet, token_of):
    params = stdio_params(token_of(viewer))

    async def main() -> None:
        async with Client(
            stdio_client(params), mode="legacy", cache=None, read_timeout_seconds=DEADLINE
        ) as client:
            listed = structured(await client.call_tool("list_automations", {}))
            assert [a["name"] for a in listed["automations"]] == ["greet"]
            refused = await client.call_tool(
                "run_automation", {"automation_id": str(greet.pk), "inputs": {"who": "v"}}
            )
            assert structured(refused)["error"]["code"] == "PERMISSION_DENIED"

    anyio.run(main)
    assert not Run.objects.exists()


def test_stdio_server_with_a_bad_token_exits_before_any_tool_list(transactional_db, tmp_path):
    errlog = (tmp_path / "stderr.txt").open("w+")
    seen: list[str] = []

    async def main() -> None:
        with anyio.fail_after(DEADLINE):
            async with Client(stdio_client(stdio_params("not-a-token"), errlog=errlog), mode="legacy",
                              cache=None) as client:  # fmt: skip
                seen.extend(tool.name for tool in (await client.list_tools()).tools)

    with pytest.raises(BaseExceptionGroup) as caught:
        anyio.run(main)
    assert caught.group_contains(
        MCPError, match="Connection closed", depth=None
    )  # the process exited, no deadline
    assert seen == []
    errlog.seek(0)
    assert "AUTOPLANE_API_TOKEN is missing or is not a valid 'mcp'-scoped API token" in errlog.read()


@pytest.mark.parametrize("token", ["", "not-a-token"])
def test_stdio_refuses_to_start_without_a_valid_token(db, settings, token):
    settings.AUTOPLANE_API_TOKEN = token
    stdout = io.StringIO()
    with redirect_stdout(stdout), pytest.raises(CommandError, match="AUTOPLANE_API_TOKEN"):
        call_command("mcp_serve")
    assert stdout.getvalue() == ""  # not one byte of MCP was spoken


def test_stdio_refuses_a_full_scope_token(settings, viewer):
    # A full token could approve on the REST API: not one for a model's client.
    settings.AUTOPLANE_API_TOKEN = api_token(viewer)
    stdout = io.StringIO()
    with redirect_stdout(stdout), pytest.raises(CommandError, match="--scope mcp"):
        call_command("mcp_serve")
    assert stdout.getvalue() == ""


# --- streamable HTTP -------------------------------------------------------------------------


class McpHttpProcess(live.LiveProcess):
    kind = "mcp"

    def __init__(self, port: int):
        self.port = port
        argv = [
            sys.executable,
            "manage.py",
            "mcp_serve",
            "--http",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
        super().__init__(argv, name=f"mcp-http-{port}", env=live.live_worker_env())

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited:\n{self.log_tail()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} not listening after {timeout:.0f} s:\n{self.log_tail()}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def _mcp_http_server(django_db_setup, django_db_blocker):
    """One server for the module: it keeps no state between requests, and reads the test database."""
    with django_db_blocker.unblock():
        process = McpHttpProcess(_free_port()).start(timeout=DEADLINE)
    yield f"http://127.0.0.1:{process.port}/mcp"
    process.stop()


@pytest.fixture
def mcp_url(transactional_db, _mcp_http_server):
    return _mcp_http_server


def http_client(url: str, token: str) -> Client:
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=DEADLINE)
    return Client(streamable_http_client(url, http_client=http), cache=None, read_timeout_seconds=DEADLINE)


def test_http_look_fire_and_follow(celery_workers, mcp_url, operator, greet, gated, token_of):
    token = token_of(operator)

    async def main() -> None:
        async with http_client(mcp_url, token) as client:
            await look_fire_follow(client, greet, gated)

    anyio.run(main)


def test_http_roles_and_workspaces_hold(mcp_url, viewer, outsider, greet, token_of):
    viewer_token, outsider_token = token_of(viewer), token_of(outsider)

    async def main() -> None:
        async with http_client(mcp_url, viewer_token) as client:
            assert [
                a["name"] for a in structured(await client.call_tool("list_automations", {}))["automations"]
            ] == ["greet"]
            refused = await client.call_tool(
                "run_automation", {"automation_id": str(greet.pk), "inputs": {"who": "v"}}
            )
            assert refused.is_error
            assert structured(refused)["error"]["code"] == "PERMISSION_DENIED"
        async with http_client(mcp_url, outsider_token) as client:
            assert structured(await client.call_tool("list_automations", {}))["count"] == 0
            hidden = await client.call_tool("describe_automation", {"automation_id": str(greet.pk)})
            assert structured(hidden)["error"]["code"] == "NOT_FOUND"
            huge = await client.call_tool("list_automations", {"search": "x" * (1024 * 1024)})
            assert structured(huge)["error"]["code"] == "PAYLOAD_TOO_LARGE"
            wrong = await client.call_tool("get_run", {"run_id": ["not", "an", "id"]})
            assert structured(wrong)["error"]["code"] == "INVALID_ARGUMENT"

    anyio.run(main)


@pytest.mark.parametrize("authorization", [None, "Bearer not-a-token", "Token {token}", "Basic dXNlcjpwdw==",
                                           "Bearer {full}", "Bearer {expired}"])  # fmt: skip
def test_http_refuses_a_missing_or_bad_token_before_listing_tools(mcp_url, viewer, token_of, authorization):
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    if authorization is not None:
        expired = api_token(viewer, scope="mcp", expires_at=timezone.now() + timedelta(seconds=60))
        ApiToken.objects.filter(digest=token_digest(expired)).update(
            expires_at=timezone.now() - timedelta(seconds=1)
        )
        headers["Authorization"] = authorization.format(
            token=token_of(viewer), full=api_token(viewer), expired=expired
        )
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    answer = httpx.post(mcp_url, json=body, headers=headers, timeout=DEADLINE)

    assert answer.status_code == 401
    assert answer.headers["WWW-Authenticate"].startswith("Bearer")
    assert "list_automations" not in answer.text


def test_http_sdk_client_with_a_bad_token_cannot_connect(mcp_url):
    async def main() -> None:
        async with http_client(mcp_url, "not-a-token") as client:
            await client.list_tools()

    with pytest.raises(BaseExceptionGroup) as caught:
        anyio.run(main)
    assert caught.group_contains(MCPError, depth=None)
