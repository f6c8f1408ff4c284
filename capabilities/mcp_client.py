"""Talking to one MCP server, from synchronous code: the calls and their types.

No Django and no ``mcp`` SDK here: :mod:`capabilities.mcp` reads the database,
builds a :class:`Connection` (credential material already resolved into headers
or environment variables) and calls :func:`list_tools` or :func:`call_tool`.
Each call opens a fresh client and closes it, so any worker can make it.

The SDK work is in :mod:`capabilities.mcp_sdk`, loaded by :func:`_sdk` on the
first call (``import_module``, like the registry's dotted paths; nothing else
imports it): importing ``mcp`` costs about 1.5 s of CPU, which every web, beat
and worker process would otherwise pay at start-up, though only a worker
calling a tool or harvesting a server needs it. ``tests/test_import_graph.py``
checks that starting Django does not import it. Failure mapping: see
:mod:`capabilities.mcp_sdk`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import import_module
from types import ModuleType
from typing import Any

SDK_MODULE = "capabilities.mcp_sdk"


class McpCallError(Exception):
    """A failure with a stable code; ``message`` is safe to show, ``detail`` is for logs and audit."""

    def __init__(self, code: str, message: str, *, retryable: bool, detail: str = ""):
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.retryable = retryable
        self.detail = detail


@dataclass(frozen=True)
class Connection:
    """Everything needed to reach one server, resolved from the database at call time."""

    label: str  # the server slug, for messages
    transport: str  # "http" | "stdio"
    timeout: float
    url: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    # The addresses the egress guard approved for the URL's host; connections go only there.
    pinned_host: str = ""
    pinned_addresses: tuple[str, ...] = ()
    argv: Sequence[str] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # Credential material sent to the server: redacted from anything cut short
    # here (a truncated secret would slip past the engine's exact-match redaction).
    secrets: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolInfo:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any]

    @property
    def hash(self) -> str:
        return tool_hash(self.description, self.input_schema, self.output_schema, self.annotations)


@dataclass
class ToolResult:
    is_error: bool
    structured: Any
    content: list[Any]

    def text(self) -> str:
        return "\n".join(c for c in self.content if isinstance(c, str))


def tool_hash(
    description: str, input_schema: Any, output_schema: Any, annotations: Mapping[str, Any] | None = None
) -> str:
    """sha256 over the canonical JSON of what an admin approves.

    Annotations are included although they are only hints: they decide the
    capability's side effects and idempotency (and so whether the engine retries
    it), so flipping ``readOnlyHint`` must be re-approved like a new description.
    """
    material = {
        "description": description or "",
        "input_schema": input_schema or {},
        "output_schema": output_schema,
        "annotations": dict(annotations or {}),
    }
    canonical = json.dumps(material, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass
class CallOutcome:
    """Either the tool's listing no longer matches what was approved (``listed``), or its result."""

    listed: ToolInfo | None
    result: ToolResult | None = None


@cache
def _sdk() -> ModuleType:
    return import_module(SDK_MODULE)


def list_tools(conn: Connection) -> list[ToolInfo]:
    """Every tool the server offers (paged, at most ``MAX_TOOLS``)."""
    return _sdk().list_tools(conn)


def call_tool(
    conn: Connection, name: str, arguments: Mapping[str, Any], *, approved_hash: str, read_only: bool
) -> CallOutcome:
    """List the tool, refuse to call it unless it is exactly what was approved, then call it."""
    return _sdk().call_tool(conn, name, arguments, approved_hash=approved_hash, read_only=read_only)
