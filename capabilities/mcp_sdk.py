"""The ``mcp`` SDK side of :mod:`capabilities.mcp_client` (imported on the first MCP call only).

No Django here: :mod:`capabilities.mcp` reads the database, builds a
:class:`Connection` (credential material already resolved into headers or
environment variables) and calls :func:`list_tools` or :func:`call_tool`.
Each call opens a fresh client and closes it, so any worker can make it.

The SDK is async; :func:`run_async` runs it on a private event loop (Celery
prefork workers have none; if the calling thread already runs one, the work
moves to a helper thread).

Failure mapping (what the executor's retry and recovery logic rely on):

* anything before ``tools/call`` was handed to the server — spawn, connect,
  DNS, TLS, handshake, listing, HTTP 5xx, the deadline running out — is
  ``TEMPORARILY_UNAVAILABLE`` (retryable): the tool cannot have run;
* HTTP 401/403 at any point is ``INVALID_ARGUMENT`` (the credential was refused);
* after ``tools/call`` was sent: a connect error or an HTTP 5xx/429 answer to
  that POST is ``TEMPORARILY_UNAVAILABLE``; a JSON-RPC error from the server
  (unknown tool, invalid params) is ``INVALID_ARGUMENT``; a read timeout, a
  dropped stream or a dead stdio process is ``OUTCOME_UNKNOWN`` (not
  retryable) — unless the tool is read-only, where it is ``TIMEOUT`` /
  ``TEMPORARILY_UNAVAILABLE`` like an HTTP GET.

Messages are safe to show; exception text goes to ``detail`` only.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

import anyio
import httpcore2
import httpx2
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, REQUEST_TIMEOUT, Implementation

from audit.redaction import redact

from .base import ErrorCode
from .mcp_client import CallOutcome, Connection, McpCallError, ToolInfo, ToolResult

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_LIST_PAGES = 50
MAX_TOOLS = 1000
MAX_TEXT_CHARS = 1024 * 1024
MAX_BINARY_CHARS = 64 * 1024
MAX_DETAIL_CHARS = 2000
CONNECT_TIMEOUT_SECONDS = 10.0
CLIENT_INFO = Implementation(name="autoplane", version="1")


def run_async(fn: Callable[[], Awaitable[T]]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return anyio.run(fn)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(anyio.run, fn).result()


# --- HTTP: the egress guard's pinning, for the SDK's httpx2 client ----------------


class _PinnedBackend(httpcore2.AsyncNetworkBackend):
    """Dial only the addresses the egress guard checked (no second DNS lookup to rebind)."""

    def __init__(self, host: str, addresses: Sequence[str]) -> None:
        self._inner = httpcore2.AnyIOBackend()
        self._host = host.lower()
        self._addresses = tuple(addresses)

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        if host.lower() != self._host or not self._addresses:
            raise httpcore2.ConnectError(f"{host} was not checked by the egress guard")
        error: Exception | None = None
        for address in self._addresses:
            try:
                return await self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error

    async def connect_unix_socket(self, path, timeout=None, socket_options=None):
        raise httpcore2.ConnectError("unix sockets are not reachable")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _http_client(conn: Connection, probe: _Probe) -> httpx2.AsyncClient:
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    # httpx2 takes no network backend parameter; swap in an identical pool that uses ours.
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False),
        max_connections=10,
        max_keepalive_connections=5,
        network_backend=_PinnedBackend(conn.pinned_host, conn.pinned_addresses),
    )

    async def on_response(response: httpx2.Response) -> None:
        if response.status_code >= 400:
            probe.statuses.setdefault(probe.phase, response.status_code)

    timeout = httpx2.Timeout(conn.timeout, connect=min(CONNECT_TIMEOUT_SECONDS, conn.timeout))
    return httpx2.AsyncClient(
        headers=dict(conn.headers), timeout=timeout, transport=transport, trust_env=False,
        event_hooks={"response": [on_response]},
    )  # fmt: skip


# --- one session --------------------------------------------------------------------


@dataclass
class _Probe:
    """Where the exchange got to, so a failure can be classified afterwards."""

    phase: str = "connect"  # connect -> list -> call -> done
    statuses: dict[str, int] = field(default_factory=dict)
    errlog: TextIO | None = None

    def stderr_tail(self, secrets: Sequence[str]) -> str:
        if self.errlog is None:
            return ""
        try:
            self.errlog.seek(0)
            return redact(self.errlog.read()[-16 * MAX_DETAIL_CHARS :], secrets)[-MAX_DETAIL_CHARS:]
        except (OSError, ValueError):
            return ""


async def _session(conn: Connection, probe: _Probe, body: Callable[[Client], Awaitable[T]]) -> T:
    async with AsyncExitStack() as stack:
        if conn.transport == "http":
            http = await stack.enter_async_context(_http_client(conn, probe))
            transport = streamable_http_client(conn.url, http_client=http)
        else:
            params = StdioServerParameters(command=conn.argv[0], args=list(conn.argv[1:]), env=dict(conn.env))
            assert probe.errlog is not None
            transport = stdio_client(params, errlog=probe.errlog)
        client = Client(transport, read_timeout_seconds=conn.timeout, cache=None, client_info=CLIENT_INFO)
        await stack.enter_async_context(client)
        probe.phase = "list"
        return await body(client)


def _run(conn: Connection, body: Callable[[Client, _Probe], Awaitable[T]], *, read_only: bool) -> T:
    probe = _Probe()
    outcome: list[T] = []

    async def recorded(client: Client) -> T:
        # Kept as soon as it arrives, so a failure while closing the session cannot lose it.
        outcome.append(await body(client, probe))
        return outcome[0]

    async def main() -> None:
        with anyio.fail_after(conn.timeout):
            await _session(conn, probe, recorded)

    errlog = (
        tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
        if conn.transport == "stdio"
        else None
    )
    probe.errlog = errlog
    try:
        run_async(main)
    except Exception as exc:  # every failure is classified below
        if outcome and probe.phase == "done":
            # The answer arrived; only closing the session failed.
            logger.info(
                "MCP server %s: error while closing the session: %s", conn.label, _describe(exc, conn.secrets)
            )
            return outcome[0]
        raise _classify(exc, probe, conn, read_only=read_only) from None
    finally:
        if errlog is not None:
            errlog.close()
    return outcome[0]


# --- operations -------------------------------------------------------------------------


async def _list_all(client: Client, *, stop_at: str | None = None) -> list[ToolInfo]:
    tools: list[ToolInfo] = []
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        for tool in page.tools:
            annotations = (
                tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
                if tool.annotations
                else {}
            )
            tools.append(
                ToolInfo(
                    name=tool.name, description=tool.description or "", input_schema=dict(tool.input_schema or {}),
                    output_schema=dict(tool.output_schema) if tool.output_schema is not None else None,
                    annotations=annotations,
                )
            )  # fmt: skip
            if stop_at is not None and tool.name == stop_at:
                return tools
        cursor = page.next_cursor
        if cursor is None or len(tools) >= MAX_TOOLS:
            break
    return tools[:MAX_TOOLS]


def list_tools(conn: Connection) -> list[ToolInfo]:
    async def body(client: Client, probe: _Probe) -> list[ToolInfo]:
        tools = await _list_all(client)
        probe.phase = "done"
        return tools

    return _run(conn, body, read_only=True)


def call_tool(
    conn: Connection, name: str, arguments: Mapping[str, Any], *, approved_hash: str, read_only: bool
) -> CallOutcome:
    """List the tool, refuse to call it unless it is exactly what was approved, then call it."""

    async def body(client: Client, probe: _Probe) -> CallOutcome:
        listed = next((t for t in await _list_all(client, stop_at=name) if t.name == name), None)
        if listed is None or listed.hash != approved_hash:
            probe.phase = "done"
            return CallOutcome(listed=listed)
        probe.phase = "call"
        result = await client.call_tool(name, dict(arguments))
        probe.phase = "done"
        return CallOutcome(listed=listed, result=_result(result, conn.secrets))

    return _run(conn, body, read_only=read_only)


def _result(result: Any, secrets: Sequence[str]) -> ToolResult:
    content: list[Any] = []
    for block in result.content or []:
        if getattr(block, "type", None) == "text":
            text = block.text if len(block.text) <= MAX_TEXT_CHARS else redact(block.text, secrets)
            content.append(text[:MAX_TEXT_CHARS])
            continue
        dumped = block.model_dump(mode="json", by_alias=True, exclude_none=True)
        if isinstance(dumped.get("data"), str) and len(dumped["data"]) > MAX_BINARY_CHARS:
            dumped["data"] = None
            dumped["truncated"] = True
        content.append(dumped)
    return ToolResult(is_error=bool(result.is_error), structured=result.structured_content, content=content)


# --- classification --------------------------------------------------------------------


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            yield from _leaves(sub)
    else:
        yield exc


def _describe(exc: BaseException, secrets: Sequence[str] = ()) -> str:
    return redact("; ".join(f"{type(e).__name__}: {e}" for e in _leaves(exc)), secrets)[:MAX_DETAIL_CHARS]


_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout, httpx2.UnsupportedProtocol)
_TIMED_OUT = (TimeoutError, httpx2.ReadTimeout, httpx2.WriteTimeout)


def _classify(exc: BaseException, probe: _Probe, conn: Connection, *, read_only: bool) -> McpCallError:
    leaves = list(_leaves(exc))
    detail = _describe(exc, conn.secrets)
    if tail := probe.stderr_tail(conn.secrets):
        detail = f"{detail}\n--- server stderr ---\n{tail}"
    label = conn.label
    status = probe.statuses.get(probe.phase)
    if status in (401, 403):
        return McpCallError(ErrorCode.INVALID_ARGUMENT, f"the MCP server {label} refused the credentials (HTTP {status})",
                            retryable=False, detail=detail)  # fmt: skip

    if probe.phase != "call":
        message = f"could not reach the MCP server {label}"
        if conn.transport == "stdio" and any(isinstance(e, OSError) for e in leaves):
            message = f"could not start the MCP server {label}"
        elif any(isinstance(e, TimeoutError) for e in leaves):
            message = f"the MCP server {label} did not answer in time"
        return McpCallError(ErrorCode.TEMPORARILY_UNAVAILABLE, message, retryable=True, detail=detail)

    rpc = [e for e in leaves if isinstance(e, MCPError)]
    timed_out = any(isinstance(e, _TIMED_OUT) for e in leaves) or any(e.code == REQUEST_TIMEOUT for e in rpc)
    if timed_out:
        if read_only:
            return McpCallError(ErrorCode.TIMEOUT, f"the MCP tool on {label} did not answer in time",
                                retryable=True, detail=detail)  # fmt: skip
        return _unknown(label, detail)
    if status is not None and (status >= 500 or status == 429):
        return McpCallError(ErrorCode.TEMPORARILY_UNAVAILABLE, f"the MCP server {label} answered HTTP {status}",
                            retryable=True, detail=detail)  # fmt: skip
    if any(isinstance(e, _NOT_SENT) for e in leaves):
        return McpCallError(ErrorCode.TEMPORARILY_UNAVAILABLE, f"could not reach the MCP server {label}",
                            retryable=True, detail=detail)  # fmt: skip
    rejected = [e for e in rpc if e.code not in (CONNECTION_CLOSED, INTERNAL_ERROR)]
    if rejected:
        return McpCallError(ErrorCode.INVALID_ARGUMENT,
                            f"the MCP server {label} rejected the call (JSON-RPC error {rejected[0].code})",
                            retryable=False, detail=detail)  # fmt: skip
    if any(isinstance(e, RuntimeError) and "structured content" in str(e).lower() for e in leaves):
        return McpCallError(ErrorCode.INVALID_ARGUMENT,
                            f"the MCP tool on {label} returned output that does not match its output schema",
                            retryable=False, detail=detail)  # fmt: skip
    if read_only:
        return McpCallError(ErrorCode.TEMPORARILY_UNAVAILABLE, f"the connection to the MCP server {label} failed",
                            retryable=True, detail=detail)  # fmt: skip
    return _unknown(label, detail)


def _unknown(label: str, detail: str) -> McpCallError:
    return McpCallError(
        ErrorCode.OUTCOME_UNKNOWN,
        f"the call to the MCP server {label} was sent but no answer arrived; whether it took effect is unknown",
        retryable=False,
        detail=detail,
    )
