"""The platform's MCP server on the wire: the official ``mcp`` SDK's low-level ``Server``.

This is the one module that imports the SDK, and only ``manage.py mcp_serve``
imports it: web and worker processes never load ``mcp`` (nor starlette or
uvicorn) for it. The tools themselves, their schemas, scoping, auditing and
errors are :mod:`mcpserver.tools`; this module only adapts them.

Transports and authentication (the REST API's tokens, scoped ``mcp`` only: see :mod:`.auth`):

* **stdio** (:func:`serve_stdio`, for desktop MCP clients that spawn the
  server): the token comes from ``AUTOPLANE_API_TOKEN``; the command refuses to
  start without a valid one, so nothing is listed to an unauthenticated peer.
  The token is checked again on every call, so revoking it takes effect at once.
* **streamable HTTP** (:func:`serve_http`, ``mcp_serve --http``): every request
  needs ``Authorization: Bearer <token>``; a missing or bad one is answered
  ``401`` with ``WWW-Authenticate: Bearer`` by the SDK's bearer middleware
  before the request reaches the MCP session, so not even ``initialize`` or
  ``tools/list`` is served. The server is stateless with JSON responses (no
  session to pin to one process, so any number of processes can sit behind a
  load balancer).

Tool calls run in worker threads (the Django ORM is synchronous); a tool's
refusal is an MCP tool result with ``isError`` and ``{"error": {code, message}}``
as structured content; an unknown tool name is a JSON-RPC ``invalid params`` error.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import uvicorn
from django.db import InterfaceError, OperationalError, close_old_connections
from mcp.server import Server, ServerRequestContext
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import AnyHttpUrl

from config.errors import ServiceError

from .auth import user_for_token
from .tools import TOOLS, UnknownTool, database_unavailable, error_body, tool_call

logger = logging.getLogger(__name__)

SERVER_NAME = "autoplane"
INSTRUCTIONS = (
    "autoplane runs automations (JSON definitions of steps) on a schedule, a webhook, an event or on demand. "
    "Look with list_automations / describe_automation, start a run with run_automation, follow it with get_run "
    "and get_audit_trace. Steps whose risk exceeds an automation's autonomy wait for a human approval: "
    "list_pending_approvals shows them, and no tool can approve or deny."
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")

TokenSource = Callable[[ServerRequestContext[Any, Any]], str | None]


def _tool_list() -> list[types.Tool]:
    return [
        types.Tool(
            name=tool.name,
            title=tool.title,
            description=tool.description,
            input_schema=tool.input_schema,
            output_schema=tool.output_schema,
            annotations=types.ToolAnnotations(
                title=tool.title,
                read_only_hint=tool.read_only,
                destructive_hint=False,  # nothing destructive exists (no delete, deny, edit)
                idempotent_hint=tool.idempotent,
                open_world_hint=tool.open_world,
            ),
        )
        for tool in TOOLS.values()
    ]


def _call_as_token_user(token: str | None, name: str, arguments: Any) -> dict[str, Any]:
    """In a worker thread: resolve the token (again: it may have been revoked) and run the tool."""
    close_old_connections()
    try:
        try:
            user = user_for_token(token)
        except (OperationalError, InterfaceError):
            raise database_unavailable() from None
        if user is None:
            raise ServiceError("UNAUTHENTICATED", "the API token is missing, revoked or invalid", 401)
        return tool_call(user=user, name=name, arguments=arguments)
    finally:
        close_old_connections()


def _result(body: dict[str, Any], *, error: bool = False) -> types.CallToolResult:
    text = json.dumps(body, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(text=text)], structured_content=body, is_error=error
    )


def build_server(token_for: TokenSource) -> Server[Any]:
    """The MCP server; ``token_for(ctx)`` says which API token a request carries."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=_tool_list())

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        token = token_for(ctx)
        try:
            body = await anyio.to_thread.run_sync(_call_as_token_user, token, params.name, params.arguments)
        except UnknownTool as exc:
            raise MCPError(INVALID_PARAMS, exc.message) from None
        except ServiceError as exc:
            return _result(error_body(exc), error=True)
        return _result(body)

    return Server(
        SERVER_NAME, version="1", title="autoplane", instructions=INSTRUCTIONS,
        on_list_tools=list_tools, on_call_tool=call_tool,
        # Lets the SDK validate Mcp-Param-* headers (2026-07-28 HTTP) without a tools/list.
        get_tool_input_schema=lambda name: TOOLS[name].input_schema if name in TOOLS else None,
    )  # fmt: skip


# --- stdio ----------------------------------------------------------------------------------


def serve_stdio(token: str) -> None:
    server = build_server(lambda ctx: token)

    async def main() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(main)


# --- streamable HTTP ------------------------------------------------------------------------


class ApiTokenVerifier:
    """The SDK's ``TokenVerifier``: a bearer token is valid when it is an active user's unexpired
    ``mcp``-scoped API token."""

    async def verify_token(self, token: str) -> AccessToken | None:
        user = await anyio.to_thread.run_sync(_user_id_for_token, token)
        if user is None:
            return None
        # client_id/subject identify the principal (the SDK binds request state to it).
        return AccessToken(token=token, client_id=f"user:{user}", subject=str(user), scopes=[])


def _user_id_for_token(token: str) -> int | None:
    close_old_connections()
    try:
        user = user_for_token(token)
        return None if user is None else user.pk
    finally:
        close_old_connections()


def _bearer_token(ctx: ServerRequestContext[Any, Any]) -> str | None:
    user = ctx.request.scope.get("user") if ctx.request is not None else None
    return user.access_token.token if isinstance(user, AuthenticatedUser) else None


def http_app(*, host: str, port: int, path: str = "/mcp"):
    """The ASGI app: bearer-authenticated, stateless, JSON responses."""
    server = build_server(_bearer_token)
    return server.streamable_http_app(
        streamable_http_path=path,
        stateless_http=True,
        json_response=True,
        host=host,  # loopback hosts get the SDK's DNS-rebinding protection (Host/Origin checks)
        token_verifier=ApiTokenVerifier(),
        # No OAuth authorization server: API tokens are created by `manage.py create_api_token`.
        # The SDK wants an issuer URL to enable bearer auth; without resource_server_url it
        # advertises nothing.
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(f"http://{_url_host(host)}:{port}"), resource_server_url=None
        ),
    )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def serve_http(*, host: str, port: int, path: str = "/mcp", log_level: str = "warning") -> None:
    uvicorn.run(http_app(host=host, port=port, path=path), host=host, port=port, log_level=log_level)
