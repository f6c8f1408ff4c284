"""MCP servers and their tools as capabilities (SPEC §5.3).

* **Harvest** (:func:`mcp_harvest`, daily on beat and on demand) lists a
  server's tools with the official SDK and records them as :class:`McpTool`
  rows. A new tool is active but untrusted (risk ``high`` until an admin sets
  an override). A tool whose description, schemas or annotations changed is
  **disabled** until an admin re-approves it (rug-pull guard); a tool no
  longer listed is marked **removed** (never deleted). Every change is audited.
* **Calls** (:func:`call_tool`) build a client from the database on every
  call, resolve the server's credential at that moment, list the tool again and
  refuse to call it unless it is exactly what was approved, then call it.
* **Capabilities**: active, approved tools of enabled servers are exposed to
  the engine as ``<server-slug>.<tool-name>`` through the registry hooks set in
  ``CapabilitiesConfig.ready``; anything else is not found.

Credentials reach the server at call time only: over HTTP as the
``Authorization`` header (bearer, basic, oauth2) or the credential's own
header (header kind); for stdio as environment variables the server row
declares, e.g. ``env = {"API_TOKEN": "$credential"}`` (the credential's main
secret: token, value, password or access token) or
``"$credential.<field>"`` (e.g. ``$credential.username``).
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from django.db import transaction
from django.utils import timezone
from jsonschema.exceptions import SchemaError

from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from config.errors import ServiceError

from . import egress, json_schema, mcp_client
from .base import ActionContext, Capability, Envelope, ErrorCode, Risk, SideEffect, StepFailure
from .credentials import credential_resolve
from .models import Credential, CredentialKind, McpServer, McpTool, McpToolStatus, McpTransport, RiskLevel

logger = logging.getLogger(__name__)

SLUG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,199}$")
ENV_NAME_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Native capability ids live in these namespaces; a server may not shadow them.
RESERVED_SLUGS = frozenset({"core", "autoplane", "builtin"})
DEFAULT_CALL_TIMEOUT = 30.0
HARVEST_TIMEOUT = 60.0
EXPECTED_DURATION_SECONDS = 30.0
CREDENTIAL_REF = "$credential"
MAX_ERROR_TEXT = 2000
MAX_ARGV = 64
MAX_DATA_CHARS = 1024 * 1024
PREVIEW_CHARS = 64 * 1024


class McpServiceError(ServiceError):
    """A refused MCP operation; ``message`` is safe to show. An invalid argument names its ``path``."""

    def __init__(self, code: str, message: str, *, http_status: int = 400, path: str = "/"):
        errors = [{"path": path, "code": code, "message": message}] if code == "INVALID_ARGUMENT" else None
        super().__init__(code, message, http_status, errors=errors)
        self.path = path


@dataclass
class HarvestResult:
    new: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    unchanged: int = 0

    def counts(self) -> dict[str, int]:
        return {
            "new": len(self.new),
            "changed": len(self.changed),
            "removed": len(self.removed),
            "restored": len(self.restored),
            "unchanged": self.unchanged,
        }


def _audit(server: McpServer, type: str, summary: str, *, user=None, actor: str | None = None,
           outcome: str = Outcome.INFO, refs: dict | None = None, payload: dict | None = None,
           trace_id: str | None = None, secrets: list[str] | tuple[str, ...] = ()) -> None:  # fmt: skip
    writer.append(
        trace_id=trace_id or uuid.uuid4().hex, type=type, summary=summary, outcome=outcome,
        workspace_id=server.workspace_id, stage="mcp", actor=actor or writer.actor_for(user),
        refs={"mcp_server": str(server.pk), **(refs or {})}, payload={"server": server.slug, **(payload or {})},
        secrets=secrets,
    )  # fmt: skip


# --- servers ---------------------------------------------------------------------


def may_configure_stdio(user) -> bool:
    """A stdio server runs a command on the worker hosts, outside the sandbox: platform superusers only."""
    return user is None or bool(getattr(user, "is_superuser", False))


def clean_server_fields(*, workspace, transport: str, url: str, command: Any, env: Any,
                         credential: Credential | None, user) -> dict[str, Any]:  # fmt: skip
    if transport not in McpTransport.values:
        raise McpServiceError("INVALID_ARGUMENT", "transport must be 'http' or 'stdio'", path="/transport")
    if credential is not None and credential.workspace_id != workspace.id:
        raise McpServiceError(
            "INVALID_ARGUMENT", "the credential belongs to another workspace", path="/credential"
        )
    env = {} if env is None else env
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and ENV_NAME_PATTERN.match(k) and isinstance(v, str) and "\x00" not in v
        for k, v in env.items()
    ):
        raise McpServiceError("INVALID_ARGUMENT", "env must map variable names to strings", path="/env")
    if transport == McpTransport.HTTP:
        if (
            not isinstance(url, str)
            or not re.match(r"^https?://[^\s/]+", url, re.IGNORECASE)
            or len(url) > 2000
        ):
            raise McpServiceError("INVALID_ARGUMENT", "an http server needs an http(s) url", path="/url")
        return {"url": url, "command": [], "env": dict(env)}
    if not may_configure_stdio(user):
        raise McpServiceError("PERMISSION_DENIED", "only platform superusers may configure stdio MCP servers",
                              http_status=403, path="/transport")  # fmt: skip
    if (
        not isinstance(command, list) or not command or len(command) > MAX_ARGV
        or not all(isinstance(a, str) and a and "\x00" not in a and len(a) <= 4096 for a in command)
    ):  # fmt: skip
        raise McpServiceError("INVALID_ARGUMENT", "a stdio server needs command: a non-empty argv list of strings",
                              path="/command")  # fmt: skip
    references = [v for v in env.values() if v == CREDENTIAL_REF or v.startswith(CREDENTIAL_REF + ".")]
    if references and credential is None:
        raise McpServiceError("INVALID_ARGUMENT", "env refers to $credential but the server has no credential",
                              path="/env")  # fmt: skip
    if credential is not None and not references:
        raise McpServiceError("INVALID_ARGUMENT", "a stdio server receives its credential through env: "
                              'map a variable to "$credential", e.g. {"API_TOKEN": "$credential"}',
                              path="/env")  # fmt: skip
    return {"url": "", "command": list(command), "env": dict(env)}


@transaction.atomic
def mcp_server_create(
    *, workspace, slug: str, name: str = "", transport: str = McpTransport.HTTP, url: str = "",
    command: list[str] | None = None, env: Mapping[str, str] | None = None, credential: Credential | None = None,
    enabled: bool = True, user=None,
) -> McpServer:  # fmt: skip
    if not isinstance(slug, str) or not SLUG_PATTERN.match(slug) or slug in RESERVED_SLUGS:
        raise McpServiceError("INVALID_ARGUMENT", "slug must be 1-64 lowercase letters, digits, '-' or '_' "
                              "(and not a reserved name)", path="/slug")  # fmt: skip
    if McpServer.objects.filter(workspace=workspace, slug=slug).exists():
        raise McpServiceError("CONFLICT", f"an MCP server '{slug}' already exists in this workspace",
                              http_status=409, path="/slug")  # fmt: skip
    fields = clean_server_fields(workspace=workspace, transport=transport, url=url, command=command, env=env,
                                  credential=credential, user=user)  # fmt: skip
    server = McpServer.objects.create(
        workspace=workspace, slug=slug, name=name or slug, transport=transport, credential=credential,
        enabled=enabled, **fields,
    )  # fmt: skip
    _audit(server, "mcp.server.created", f"MCP server {slug} ({transport}) added", user=user, outcome=Outcome.SUCCESS,
           # Masked as viewers see them: the ledger is readable by every member and never changes.
           payload={"transport": transport, "url": masked_url(fields["url"]), "command": masked_command(fields["command"]),
                    "credential": credential.name if credential else None})  # fmt: skip
    return server


@transaction.atomic
def mcp_server_update(*, server: McpServer, user=None, **changes: Any) -> McpServer:
    """Change name, url, command, env, credential or enabled (the transport and slug are fixed)."""
    server = McpServer.objects.select_for_update().get(pk=server.pk)
    allowed = {"name", "url", "command", "env", "credential", "enabled"}
    unknown = set(changes) - allowed
    if unknown:
        raise McpServiceError("INVALID_ARGUMENT", f"cannot change {', '.join(sorted(unknown))}")
    credential = changes.get("credential", server.credential)
    fields = clean_server_fields(
        workspace=server.workspace, transport=server.transport, url=changes.get("url", server.url),
        command=changes.get("command", server.command), env=changes.get("env", server.env), credential=credential,
        user=user,
    )  # fmt: skip
    server.name = changes.get("name", server.name) or server.slug
    server.enabled = bool(changes.get("enabled", server.enabled))
    server.credential = credential
    server.url, server.command, server.env = fields["url"], fields["command"], fields["env"]
    server.save(update_fields=["name", "enabled", "credential", "url", "command", "env", "updated_at"])
    _audit(server, "mcp.server.updated", f"MCP server {server.slug} updated", user=user, outcome=Outcome.SUCCESS,
           payload={"changed": sorted(changes)})  # fmt: skip
    return server


@transaction.atomic
def mcp_server_delete(*, server: McpServer, user=None) -> None:
    _audit(server, "mcp.server.deleted", f"MCP server {server.slug} and its tools deleted", user=user,
           outcome=Outcome.SUCCESS, payload={"tools": server.tools.count()})  # fmt: skip
    server.delete()


# --- connections -----------------------------------------------------------------


def _primary_secret(value: Mapping[str, Any]) -> str | None:
    for key in ("token", "access_token", "value", "password"):
        if isinstance(value.get(key), str) and value[key]:
            return value[key]
    return None


def _credential_headers(value: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    kind = value.get("kind")
    if kind in (CredentialKind.BEARER, CredentialKind.OAUTH2) and (
        token := value.get("token") or value.get("access_token")
    ):
        return {"Authorization": f"Bearer {token}"}, []
    if kind == CredentialKind.BASIC and value.get("username") and value.get("password"):
        encoded = base64.b64encode(f"{value['username']}:{value['password']}".encode()).decode()
        return {"Authorization": f"Basic {encoded}"}, [encoded]
    if kind == CredentialKind.HEADER and value.get("header_name") and value.get("value"):
        return {value["header_name"]: value["value"]}, []
    raise StepFailure(
        ErrorCode.INVALID_ARGUMENT, "the MCP server's credential cannot be used over HTTP", retryable=False
    )


def connection_for(server: McpServer, *, timeout: float, secrets: list[str], trace_id: str | None = None):
    """A :class:`mcp_client.Connection` from the server row, resolving its credential now.

    Every secret value resolved is appended to ``secrets`` (the caller redacts with it).
    """
    value: dict[str, Any] | None = None
    credential = server.credential  # no query when the server has none
    if credential is not None:
        value, resolved = credential_resolve(
            workspace_id=server.workspace_id, name=credential.name, trace_id=trace_id
        )
        secrets.extend(s for s in resolved if s not in secrets)
    if server.transport == McpTransport.STDIO:
        env: dict[str, str] = {}
        for key, raw in (server.env or {}).items():
            if raw == CREDENTIAL_REF or raw.startswith(CREDENTIAL_REF + "."):
                field_name = raw[len(CREDENTIAL_REF) + 1 :]
                secret = (value or {}).get(field_name) if field_name else _primary_secret(value or {})
                if not isinstance(secret, str) or not secret:
                    raise StepFailure(ErrorCode.INVALID_ARGUMENT,
                                      f"the MCP server's env refers to a credential field it does not have ({raw})",
                                      retryable=False)  # fmt: skip
                env[key] = secret
            else:
                env[key] = raw
        return mcp_client.Connection(
            label=server.slug, transport="stdio", timeout=timeout, argv=tuple(server.command), env=env,
            secrets=tuple(secrets),
        )  # fmt: skip
    headers, extra = _credential_headers(value) if value is not None else ({}, [])
    secrets.extend(s for s in extra if s not in secrets)
    allowlist = egress.effective_allowlist(server.workspace.egress_allowlist or ())
    parsed = egress.parse_url(server.url)
    addresses = egress.resolve_url(parsed, allowlist)  # POLICY_VIOLATION for a private target not allowlisted
    return mcp_client.Connection(
        label=server.slug, transport="http", timeout=timeout, url=server.url, headers=headers,
        pinned_host=egress.connect_host(parsed), pinned_addresses=addresses, secrets=tuple(secrets),
    )  # fmt: skip


# --- what a viewer sees ----------------------------------------------------------------

MASK = "***"


def masked_url(url: str) -> str:
    """``url`` without what can hold a literal secret: userinfo, query values and fragment masked."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return MASK
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    if parts.username is not None or parts.password is not None:
        netloc = f"{MASK}@{netloc}"
    query = "&".join(f"{pair.split('=', 1)[0]}={MASK}" if "=" in pair else MASK
                     for pair in parts.query.split("&") if pair)  # fmt: skip
    return urlunsplit((parts.scheme, netloc, parts.path, query, MASK if parts.fragment else ""))


_SECRET_FLAG = re.compile(r"(?i)^-{1,2}[\w.-]*(token|key|secret|passw|pwd|auth|credential|bearer)[\w.-]*$")


def masked_command(argv: list[Any] | None) -> list[str]:
    """``argv`` with what looks like a literal secret masked: the value of a ``--token``/``--api-key``/...
    flag (``--token X`` or ``--token=X``) and the userinfo and query of a URL argument."""
    shown: list[str] = []
    hide_next = False
    for arg in argv or []:
        text = str(arg)
        flag, eq, _value = text.partition("=")
        if hide_next:
            shown.append(MASK)
            hide_next = False
        elif eq and _SECRET_FLAG.match(flag):
            shown.append(f"{flag}={MASK}")
        elif _SECRET_FLAG.match(text):
            shown.append(text)
            hide_next = True
        elif "://" in text:
            shown.append(masked_url(text))
        else:
            shown.append(text)
    return shown


def masked_env(env: Mapping[str, Any] | None) -> dict[str, str]:
    """``env``'s keys with every literal value masked (a ``$credential`` reference is no secret)."""
    return {
        key: value if isinstance(value, str) and (value == CREDENTIAL_REF or value.startswith(CREDENTIAL_REF + "."))
        else MASK
        for key, value in (env or {}).items()
    }  # fmt: skip


# --- harvest ---------------------------------------------------------------------


def _tool_fields(info: mcp_client.ToolInfo) -> dict[str, Any]:
    return {
        "description": info.description,
        "input_schema": info.input_schema,
        "output_schema": info.output_schema,
        "annotations": info.annotations,
        "schema_hash": info.hash,
    }


def _record_listing(server: McpServer, tool: McpTool | None, info: mcp_client.ToolInfo | None, *, now,
                    actor: str, trace_id: str) -> str:  # fmt: skip
    """Apply what the server lists now for one tool; returns new|changed|restored|removed|unchanged.

    Runs inside the caller's transaction, with the tool row locked.
    """
    if tool is None:
        assert info is not None
        # A new tool waits for an admin like a changed one: nothing about it is trusted yet.
        tool = McpTool.objects.create(server=server, name=info.name, approved_hash="",
                                      status=McpToolStatus.PENDING, last_seen=now, **_tool_fields(info))  # fmt: skip
        _audit(server, "mcp.tool.added",
               f"MCP tool {server.slug}.{info.name} discovered: pending until an admin approves it",
               actor=actor, trace_id=trace_id, refs={"mcp_tool": str(tool.pk)},
               payload={"tool": info.name, "schema_hash": info.hash, "annotations": info.annotations})  # fmt: skip
        return "new"
    if info is None:
        if tool.status == McpToolStatus.REMOVED:
            return "unchanged"
        tool.status = McpToolStatus.REMOVED
        tool.save(update_fields=["status"])
        _audit(server, "mcp.tool.removed", f"MCP tool {server.slug}.{tool.name} is no longer offered",
               actor=actor, trace_id=trace_id, refs={"mcp_tool": str(tool.pk)}, payload={"tool": tool.name})  # fmt: skip
        return "removed"
    new_hash = info.hash
    tool.last_seen = now
    if new_hash == tool.schema_hash and tool.status != McpToolStatus.REMOVED:
        tool.save(update_fields=["last_seen"])
        return "unchanged"
    was = tool.status
    old_hash, old_description = tool.schema_hash, tool.description
    for name, value in _tool_fields(info).items():
        setattr(tool, name, value)
    # Exactly what an admin approved may run again; anything else waits for re-approval.
    if new_hash == tool.approved_hash:
        tool.status = McpToolStatus.ACTIVE
    else:  # never approved: still pending; approved before: disabled until re-approved
        tool.status = McpToolStatus.DISABLED if tool.approved_hash else McpToolStatus.PENDING
    tool.save(update_fields=[*_tool_fields(info), "status", "last_seen"])
    if old_hash == new_hash:  # it had been removed and is offered again, unchanged
        _audit(server, "mcp.tool.restored", f"MCP tool {server.slug}.{tool.name} is offered again ({tool.status})",
               actor=actor, trace_id=trace_id, refs={"mcp_tool": str(tool.pk)}, payload={"tool": tool.name})  # fmt: skip
        return "restored"
    outcome = Outcome.FAILURE if tool.status == McpToolStatus.DISABLED else Outcome.INFO
    summary = {
        McpToolStatus.DISABLED: f"MCP tool {server.slug}.{tool.name} changed since it was approved: "
        "disabled until an admin re-approves it",
        McpToolStatus.PENDING: f"MCP tool {server.slug}.{tool.name} changed before anyone approved it: "
        "still pending",
    }.get(tool.status, f"MCP tool {server.slug}.{tool.name} is back to its approved definition")
    _audit(server, "mcp.tool.changed", summary, actor=actor, trace_id=trace_id, outcome=outcome,
           refs={"mcp_tool": str(tool.pk)},
           payload={"tool": tool.name, "previous_status": was, "status": tool.status, "previous_hash": old_hash,
                    "schema_hash": new_hash, "approved_hash": tool.approved_hash,
                    "previous_description": old_description[:MAX_ERROR_TEXT],
                    "description": info.description[:MAX_ERROR_TEXT]})  # fmt: skip
    return "changed"


def _unusable(info: mcp_client.ToolInfo) -> str:
    """Why a listed tool cannot become a capability ("" if it can)."""
    if not TOOL_NAME_PATTERN.match(info.name):
        return "invalid tool name"
    for label, schema in (("input", info.input_schema), ("output", info.output_schema)):
        if schema is None and label == "output":
            continue
        if not isinstance(schema, dict):
            return f"{label} schema is not an object"
        try:
            json_schema.check_schema(schema)
        except SchemaError:
            return f"{label} schema is not a valid JSON Schema"
    return ""


def mcp_harvest(server: McpServer, *, user=None, actor: str | None = None) -> HarvestResult:
    """List ``server``'s tools now and reconcile the McpTool rows; raises McpServiceError on failure."""
    server = McpServer.objects.select_related("workspace", "credential").get(pk=server.pk)
    actor = actor or writer.actor_for(user)
    trace_id = uuid.uuid4().hex
    secrets: list[str] = []
    try:
        conn = connection_for(server, timeout=HARVEST_TIMEOUT, secrets=secrets, trace_id=trace_id)
        listing = mcp_client.list_tools(conn)
    except (StepFailure, mcp_client.McpCallError) as exc:
        detail = redact(getattr(exc, "detail", "") or "", secrets)
        with transaction.atomic():
            McpServer.objects.filter(pk=server.pk).update(last_error=exc.message[:500])
            _audit(server, "mcp.server.harvest_failed", f"harvesting MCP server {server.slug} failed: {exc.message}",
                   actor=actor, trace_id=trace_id, outcome=Outcome.FAILURE,
                   payload={"code": exc.code, "detail": detail}, secrets=secrets)  # fmt: skip
        logger.warning("MCP harvest of %s failed: %s", server.slug, redact(detail or exc.message, secrets))
        raise McpServiceError(
            exc.code, exc.message, http_status=502 if exc.code != "POLICY_VIOLATION" else 400
        )

    result = HarvestResult()
    offered: dict[str, mcp_client.ToolInfo] = {}
    skipped: list[dict[str, str]] = []
    for info in listing:
        problem = _unusable(info) or ("listed twice" if info.name in offered else "")
        if problem:
            skipped.append({"tool": info.name[:200], "reason": problem})
        else:
            offered[info.name] = info
    now = timezone.now()
    with transaction.atomic():
        # One harvest of a server at a time (lock order: server, then its tools).
        McpServer.objects.select_for_update().filter(pk=server.pk).first()
        existing = {
            tool.name: tool
            for tool in McpTool.objects.select_for_update().filter(server=server).order_by("pk")
        }
        for name in sorted(set(existing) | set(offered)):
            change = _record_listing(server, existing.get(name), offered.get(name), now=now, actor=actor,
                                     trace_id=trace_id)  # fmt: skip
            if change == "unchanged":
                result.unchanged += 1
            else:
                getattr(result, change).append(name)
        McpServer.objects.filter(pk=server.pk).update(last_harvested_at=now, last_error="")
        _audit(server, "mcp.server.harvested", f"MCP server {server.slug} harvested: {result.counts()}",
               actor=actor, trace_id=trace_id, outcome=Outcome.SUCCESS,
               payload={**result.counts(), "skipped": skipped[:20]}, secrets=secrets)  # fmt: skip
    return result


def mcp_harvest_all() -> dict[str, Any]:
    """Harvest every enabled server (the daily beat task); one failing server does not stop the rest."""
    summary: dict[str, Any] = {"harvested": 0, "failed": 0}
    for server in McpServer.objects.filter(enabled=True).order_by("pk"):
        try:
            mcp_harvest(server, actor="beat:harvest_mcp_servers")
            summary["harvested"] += 1
        except McpServiceError:
            summary["failed"] += 1
        except Exception:
            logger.exception("harvesting MCP server %s failed unexpectedly", server.pk)
            summary["failed"] += 1
    return summary


# --- trust decisions ----------------------------------------------------------------


@transaction.atomic
def mcp_tool_approve(*, tool: McpTool, user=None) -> McpTool:
    """Trust the tool's current definition: approved_hash = schema_hash, status active."""
    tool = McpTool.objects.select_for_update().select_related("server").get(pk=tool.pk)
    if tool.status == McpToolStatus.REMOVED:
        raise McpServiceError("CONFLICT", "the server no longer offers this tool", http_status=409)
    previous = {"status": tool.status, "approved_hash": tool.approved_hash}
    tool.approved_hash = tool.schema_hash
    tool.status = McpToolStatus.ACTIVE
    tool.save(update_fields=["approved_hash", "status"])
    _audit(tool.server, "mcp.tool.approved", f"MCP tool {tool.server.slug}.{tool.name} approved", user=user,
           outcome=Outcome.SUCCESS, refs={"mcp_tool": str(tool.pk)},
           payload={"tool": tool.name, "schema_hash": tool.schema_hash, "previous": previous})  # fmt: skip
    return tool


@transaction.atomic
def mcp_tool_set_risk(*, tool: McpTool, risk: str | None, user=None) -> McpTool:
    """Set (or clear, with None) the admin's risk override for the tool."""
    if risk is not None and risk not in RiskLevel.values:
        raise McpServiceError("INVALID_ARGUMENT", "risk_override must be low, medium, high, critical or null",
                              path="/risk_override")  # fmt: skip
    tool = McpTool.objects.select_for_update().select_related("server").get(pk=tool.pk)
    previous = tool.risk_override
    if previous == risk:
        return tool
    tool.risk_override = risk
    tool.save(update_fields=["risk_override"])
    _audit(tool.server, "mcp.tool.risk_set", f"MCP tool {tool.server.slug}.{tool.name}: risk {risk or 'default (high)'}",
           user=user, outcome=Outcome.SUCCESS, refs={"mcp_tool": str(tool.pk)},
           payload={"tool": tool.name, "previous": previous, "risk_override": risk})  # fmt: skip
    return tool


# --- capabilities ----------------------------------------------------------------------


def capability_id(tool: McpTool) -> str:
    return f"{tool.server.slug}.{tool.name}"


def effective_risk(tool: McpTool) -> Risk:
    return Risk.parse(tool.risk_override) if tool.risk_override else Risk.HIGH


def _read_only(tool: McpTool) -> bool:
    return (tool.annotations or {}).get("readOnlyHint") is True


def _callable_tools():
    return McpTool.objects.select_related("server").filter(status=McpToolStatus.ACTIVE, server__enabled=True)


def as_capability(tool: McpTool) -> Capability:
    read_only = _read_only(tool)
    return Capability(
        id=capability_id(tool),
        description=tool.description,
        input_schema=tool.input_schema or {"type": "object"},
        output_schema=tool.output_schema or {},
        side_effects=frozenset({SideEffect.READ} if read_only else {SideEffect.EXTERNAL_WRITE}),
        risk=effective_risk(tool),
        # Annotations are hints from an untrusted server; only a read-only hint is
        # taken as permission to retry after an unknown outcome.
        idempotent=read_only,
        expected_duration_seconds=EXPECTED_DURATION_SECONDS,
        handler=functools.partial(_handle, server_id=tool.server_id, tool_name=tool.name),
    )


def capability_lookup(capability_id: str, workspace_id: int) -> Capability | None:
    """registry.external_lookup: an active, approved tool of an enabled server in this workspace."""
    slug, dot, name = capability_id.partition(".")
    if not dot or not name or not SLUG_PATTERN.match(slug):
        return None
    tool = _callable_tools().filter(server__workspace_id=workspace_id, server__slug=slug, name=name).first()
    if tool is None or tool.changed_since_approval:
        return None
    return as_capability(tool)


RUG_PULLED = "tool changed since approval; an admin must re-approve it"
NOT_APPROVED = "tool not approved yet; an admin must approve it"


def _held(tool: McpTool) -> str | None:
    if not tool.changed_since_approval:
        return None
    return RUG_PULLED if tool.approved_hash else NOT_APPROVED


def capability_held(capability_id: str, workspace_id: int) -> str | None:
    """registry.external_held: why a tool of an enabled server exists but may not be called."""
    slug, dot, name = capability_id.partition(".")
    if not dot or not name or not SLUG_PATTERN.match(slug):
        return None
    tool = (
        McpTool.objects.filter(server__workspace_id=workspace_id, server__slug=slug, name=name, server__enabled=True)
        .exclude(status=McpToolStatus.REMOVED)
        .first()
    )  # fmt: skip
    if tool is None:
        return None
    reason = _held(tool)
    return f"MCP tool '{capability_id}': {reason}" if reason else None


def capability_listing(workspace_id: int) -> list[Capability]:
    """registry.external_listing."""
    tools = _callable_tools().filter(server__workspace_id=workspace_id).order_by("server__slug", "name")
    return [as_capability(tool) for tool in tools if not tool.changed_since_approval]


def _handle(ctx: ActionContext, args: Mapping[str, Any], *, server_id: int, tool_name: str) -> Envelope:
    server = McpServer.objects.select_related("workspace", "credential").filter(pk=server_id).first()
    if server is None or server.workspace_id != ctx.workspace_id:
        return Envelope.failure(ErrorCode.CAPABILITY_NOT_FOUND, "unknown capability", retryable=False)
    return call_tool(server, tool_name, args, ctx)


def call_tool(server: McpServer, tool_name: str, args: Mapping[str, Any], ctx: ActionContext) -> Envelope:
    """Call one tool now; the step's envelope (or a StepFailure with a stable code)."""
    label = f"{server.slug}.{tool_name}"
    tool = McpTool.objects.filter(server=server, name=tool_name).first()
    if (
        tool is None or not server.enabled or server.workspace_id != ctx.workspace_id
        or tool.status == McpToolStatus.REMOVED
    ):  # fmt: skip
        return Envelope.failure(
            ErrorCode.CAPABILITY_NOT_FOUND, f"unknown capability '{label}'", retryable=False
        )
    if (held := _held(tool)) is not None or tool.status != McpToolStatus.ACTIVE:
        return Envelope.failure(
            ErrorCode.POLICY_VIOLATION, f"MCP tool '{label}': {held or RUG_PULLED}", retryable=False
        )
    read_only = _read_only(tool)
    timeout = max(0.1, min(float(ctx.timeout_seconds or DEFAULT_CALL_TIMEOUT), 3600.0))
    conn = connection_for(server, timeout=timeout, secrets=ctx.secrets, trace_id=ctx.trace_id)
    refs = {"run": ctx.run_id, "step": ctx.step_id, "mcp_tool": str(tool.pk)}
    try:
        outcome = mcp_client.call_tool(
            conn, tool_name, args, approved_hash=tool.approved_hash, read_only=read_only
        )
    except mcp_client.McpCallError as exc:
        detail = redact(exc.detail, ctx.secrets)
        logger.info("MCP call %s failed: %s: %s", label, exc.code, detail)
        _audit(server, "mcp.call.failed", f"{label}: {exc.message}", actor=f"run:{ctx.run_id}",
               trace_id=ctx.trace_id, outcome=Outcome.FAILURE, refs=refs,
               payload={"tool": tool_name, "code": exc.code, "detail": detail}, secrets=ctx.secrets)  # fmt: skip
        raise StepFailure(exc.code, exc.message, retryable=exc.retryable, detail=detail)

    if outcome.result is None:
        # Offered differently (or not at all) than approved: record it like a harvest would, never call it.
        with transaction.atomic():
            McpServer.objects.select_for_update().filter(pk=server.pk).first()
            locked = McpTool.objects.select_for_update().get(pk=tool.pk)
            _record_listing(server, locked, outcome.listed, now=timezone.now(), actor=f"run:{ctx.run_id}",
                            trace_id=ctx.trace_id)  # fmt: skip
        locked.refresh_from_db()
        if locked.status == McpToolStatus.REMOVED:
            return Envelope.failure(
                ErrorCode.CAPABILITY_NOT_FOUND, f"MCP tool '{label}' is no longer offered by its server",
                retryable=False,
            )  # fmt: skip
        return Envelope.failure(
            ErrorCode.POLICY_VIOLATION, f"MCP tool '{label}': {RUG_PULLED}", retryable=False
        )

    result = outcome.result
    if result.is_error:
        # The server's own error text may be anything: audit (redacted) and logs only.
        text = redact(result.text(), ctx.secrets)[:MAX_ERROR_TEXT]
        logger.info("MCP tool %s reported an error: %s", label, text)
        _audit(server, "mcp.tool.error", f"{label} reported an error", actor=f"run:{ctx.run_id}",
               trace_id=ctx.trace_id, outcome=Outcome.FAILURE, refs=refs,
               payload={"tool": tool_name, "text": text}, secrets=ctx.secrets)  # fmt: skip
        return Envelope.failure(
            ErrorCode.INVALID_ARGUMENT, f"the MCP tool {label} reported an error", retryable=False
        )
    data, truncated = _data(result, ctx.secrets)
    return Envelope.success(data, summary=f"{label} succeeded" + (" (output truncated)" if truncated else ""))


def _data(result: mcp_client.ToolResult, secrets: list[str]) -> tuple[Any, bool]:
    """The step's data (structured content, else the text parsed as JSON when it is), and whether it was cut."""
    if result.structured is not None:
        data = result.structured
    else:
        items = [_maybe_json(item) if isinstance(item, str) else item for item in result.content]
        data = items[0] if len(items) == 1 else items
    encoded = json.dumps(data, ensure_ascii=False, default=str)
    if len(encoded) <= MAX_DATA_CHARS:
        return data, False
    # Redact before cutting: a secret split at the cut would escape exact-match redaction.
    preview = redact(encoded, secrets)[:PREVIEW_CHARS]
    return {"truncated": True, "chars": len(encoded), "preview": preview}, True


def _maybe_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
