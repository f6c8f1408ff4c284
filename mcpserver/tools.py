"""The platform's own MCP tools (SPEC §5.3): models can look, fire and draft, never approve.

The contract this module keeps (``server.py`` only adapts it to the protocol):

* **One user.** Every call runs as the API token's user and sees exactly what
  the REST API shows that user: the same workspace-scoped selectors, the same
  role checks (``operate`` to run), the same serializers. Another workspace's
  objects are ``NOT_FOUND``, never ``PERMISSION_DENIED``, so ids cannot be probed.
* **One write path.** ``run_automation`` calls ``automations.services.run_create``,
  the service behind ``POST /api/v1/automations/{id}/run``: the same dispatcher,
  input validation, budget cap, concurrency policy and idempotency keys (a key
  is shared with the API's: same key and inputs → the original run; other
  inputs → ``UNPROCESSABLE``).
* **No decisions.** There is deliberately no tool that approves, denies,
  resolves, edits or deletes anything, creates standing approvals or touches
  credentials: a model that can fire a gated step must not also be able to
  wave it through. ``TOOLS`` is the complete list and a test pins it.
* **No secrets.** Outputs are what the API returns: step configs and outputs
  were redacted by the executor before they were stored; credentials are never read.
* **Audited.** Every call, refused ones included, appends ``mcp.tool.called``
  (actor = the user, ``payload.via = "mcp"``) to each workspace chain it
  touched, or to the platform chain when it touched none; a run's event joins
  the run's trace.
* **Stable errors.** Failures are the services' own ``ServiceError`` (the
  API's codes and messages); arguments are checked against the tool's input
  schema (and the API's 1 MiB body cap) before anything runs.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, transaction
from jsonschema import Draft202012Validator

from approvals import selectors as approval_selectors
from approvals.api.serializers import ApprovalOut
from approvals.models import ApprovalStatus
from audit import selectors as audit_selectors
from audit import writer
from audit.api.serializers import AuditEventSerializer
from audit.models import Outcome
from automations import selectors, services
from automations.api.drafts import DraftOut
from automations.api.serializers import AutomationOut, RunListOut, RunOut
from automations.authoring import drafts
from automations.models import Automation
from capabilities import llm
from config.errors import InvalidArgument, ServiceError
from triggers.api.serializers import TriggerOut
from triggers.selectors import triggers_of_automation
from workspaces.access import workspaces_for
from workspaces.api import require, workspace_for
from workspaces.models import Permission

from . import schemas

logger = logging.getLogger(__name__)

MAX_ARGUMENT_BYTES = 1024 * 1024  # the REST API's body cap (automations/api/views.py)
LAST_RUNS = 5
AUDIT_TYPE = "mcp.tool.called"


class UnknownTool(ServiceError):
    """No tool of that name (a protocol error in MCP terms, not a tool result)."""

    def __init__(self, name: str):
        super().__init__("NOT_FOUND", f"no tool named {name[:64]!r}", 404)


def error_body(exc: ServiceError) -> dict[str, Any]:
    """The API's error envelope; validation problems ride along under ``errors``."""
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.errors:
        body["errors"] = exc.errors
    return {"error": body}


@dataclass
class Call:
    """One tool call: who makes it, and what it touched (for the audit trail)."""

    user: Any
    workspace_ids: set[int] = field(default_factory=set)
    refs: dict[str, str] = field(default_factory=dict)
    trace_id: str | None = None

    def touch(self, workspace_id: int, **refs: Any) -> None:
        self.workspace_ids.add(workspace_id)
        self.refs.update({k: str(v) for k, v in refs.items()})


@dataclass(frozen=True)
class Tool:
    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    handler: Callable[[Call, dict[str, Any]], dict[str, Any]]
    read_only: bool = True
    idempotent: bool = True
    open_world: bool = False

    def validator(self) -> Draft202012Validator:
        return Draft202012Validator(self.input_schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _jsonable(data: Any) -> Any:
    """Serializer data as plain JSON values (UUIDs, Decimals and datetimes become strings)."""
    return json.loads(json.dumps(data, cls=DjangoJSONEncoder))


def database_unavailable() -> ServiceError:
    return ServiceError(
        "TEMPORARILY_UNAVAILABLE", "the database is unavailable; nothing was done, retry later", 503
    )


def _not_found(what: str) -> ServiceError:
    return ServiceError("NOT_FOUND", f"{what} not found", 404)


def _visible_automation(call: Call, automation_id: str) -> Automation:
    automation = selectors.automations_visible_to(call.user).filter(pk=automation_id).first()
    if automation is None:
        raise _not_found("automation")
    call.touch(automation.workspace_id, automation=automation.pk)
    return automation


# --- the tools --------------------------------------------------------------------------


def list_automations(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    automations = selectors.automations_listed_for(call.user).order_by("name", "id")
    if args.get("search"):
        automations = automations.filter(name__icontains=args["search"])
    if args.get("status"):
        automations = automations.filter(status=args["status"])
    offset = args.get("offset", 0)
    page = list(automations[offset : offset + args.get("limit", 50)])
    call.workspace_ids.update(a.workspace_id for a in page)
    return {
        "count": automations.count(),
        "automations": [
            {
                "id": str(a.pk), "name": a.name,
                "status": a.status, "version": a.version, "workspace": a.workspace.slug,
                "updated_at": a.updated_at.isoformat(),
            }
            for a in page
        ],
    }  # fmt: skip


def describe_automation(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    automation = _visible_automation(call, args["automation_id"])
    runs = selectors.runs_visible_to(call.user).filter(automation=automation)[:LAST_RUNS]
    return {
        "automation": AutomationOut(automation).data,
        "inputs_schema": (automation.definition.get("inputs") or {}).get("schema") or {"type": "object"},
        "triggers": TriggerOut(triggers_of_automation(call.user, automation.pk), many=True).data,
        "last_runs": RunListOut(runs, many=True).data,
    }


def run_automation(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    automation = _visible_automation(call, args["automation_id"])
    require(call.user, automation.workspace_id, Permission.OPERATE)
    result = services.run_create(
        automation=automation, inputs=args.get("inputs", {}), user=call.user,
        idempotency_key=args.get("idempotency_key"),
    )  # fmt: skip
    if result.suppressed or result.run is None:
        return {"run_id": None, "status": None, "status_url": None, "deduplicated": False, "suppressed": True}
    run = result.run
    call.touch(run.workspace_id, run=run.pk)
    call.trace_id = run.trace_id
    return {
        "run_id": str(run.pk), "status": run.status, "status_url": f"/api/v1/runs/{run.pk}",
        "deduplicated": result.deduplicated, "suppressed": False,
    }  # fmt: skip


def get_run(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    run = selectors.runs_visible_to(call.user).prefetch_related("steps").filter(pk=args["run_id"]).first()
    if run is None:
        raise _not_found("run")
    call.touch(run.workspace_id, run=run.pk, automation=run.automation_id)
    return RunOut(run).data


def list_pending_approvals(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    approvals = approval_selectors.approvals_visible_to(call.user, ApprovalStatus.PENDING)
    if args.get("automation_id"):
        approvals = approvals.filter(automation_id=args["automation_id"])
    if args.get("run_id"):
        approvals = approvals.filter(run_id=args["run_id"])
    page = list(approvals.select_related("workspace")[: args.get("limit", 20)])
    call.workspace_ids.update(a.workspace_id for a in page)
    return {"count": approvals.count(), "approvals": ApprovalOut(page, many=True).data}


def get_audit_trace(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    visible = workspaces_for(call.user, Permission.VIEW).values("id")
    events = audit_selectors.audit_events(
        workspace_ids=visible, trace_id=args["trace_id"], type=args.get("type")
    )
    page = list(events[: args.get("limit", 200)])
    call.workspace_ids.update(e.workspace_id for e in page if e.workspace_id is not None)
    return {
        "trace_id": args["trace_id"],
        "count": events.count(),
        "events": AuditEventSerializer(page, many=True).data,
    }


def create_draft(call: Call, args: dict[str, Any]) -> dict[str, Any]:
    """POST /api/v1/drafts: the same checks in the same order, the same service, the same shape."""
    if llm.llm_config() is None:
        raise llm.LlmNotConfigured()
    automation = None
    if args.get("automation_id"):
        automation = _visible_automation(call, args["automation_id"])
        workspace = automation.workspace
    else:
        workspace = workspace_for(call.user, args.get("workspace"), Permission.OPERATE)
    call.touch(workspace.id)
    draft = drafts.draft_create(
        workspace=workspace, user=call.user, prompt=args["prompt"], automation=automation
    )
    call.touch(workspace.id, draft=draft.pk)
    return DraftOut(draft).data


_READ = "Read-only; shows only what your API token's user may see."
TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in [
        Tool(
            "list_automations", "List automations",
            "List the automations in your workspaces (name, status, version, workspace), sorted by name. "
            "Filter by part of the name or by status; page with limit/offset. " + _READ,
            schemas.LIST_AUTOMATIONS_IN, schemas.LIST_AUTOMATIONS_OUT, list_automations,
        ),
        Tool(
            "describe_automation", "Describe an automation",
            "One automation by id: its full JSON definition, the JSON Schema its run inputs must match, "
            "its triggers (schedule, webhook, event) and its last 5 runs. " + _READ,
            schemas.DESCRIBE_AUTOMATION_IN, schemas.DESCRIBE_AUTOMATION_OUT, describe_automation,
        ),
        Tool(
            "run_automation", "Run an automation",
            "Start a run of an automation with the given inputs, as 'Run now' in the API does "
            "(POST /api/v1/automations/{id}/run): inputs are validated against its inputs_schema, its "
            "budget cap and concurrency policy apply, and steps whose risk exceeds its autonomy wait for a "
            "human approval that no tool can give. Returns the new run's id at once (status 'queued'); "
            "poll get_run for the outcome. Not idempotent, unless you pass an idempotency_key: the same key "
            "with the same inputs returns the original run instead of starting another (for 24 h). "
            "Needs the operator or admin role in the automation's workspace.",
            schemas.RUN_AUTOMATION_IN, schemas.RUN_AUTOMATION_OUT, run_automation,
            read_only=False, idempotent=False, open_world=True,
        ),
        Tool(
            "get_run", "Get a run",
            "One run by id: status (queued running awaiting_approval waiting succeeded failed cancelled "
            "timed_out needs_attention), every step in plan order with its status, attempt, rendered config, "
            "output and error, the run's output, error, cost and trace_id. Secrets are redacted. " + _READ,
            schemas.GET_RUN_IN, schemas.GET_RUN_OUT, get_run,
        ),
        Tool(
            "list_pending_approvals", "List pending approvals",
            "Approvals waiting for a human decision in your workspaces, newest first, optionally for one "
            "automation or run: what would run, why it needs approval, its risk and expiry. Deciding is not "
            "possible here: a person approves or denies in the admin, the API or a one-click link. " + _READ,
            schemas.LIST_APPROVALS_IN, schemas.LIST_APPROVALS_OUT, list_pending_approvals,
        ),
        Tool(
            "get_audit_trace", "Get an audit trace",
            "The audit ledger's events of one trace (a run's trace_id), oldest first: run created, each step, "
            "gates and approvals, with actor, outcome and redacted payload. Optionally only one event type. "
            + _READ,
            schemas.AUDIT_TRACE_IN, schemas.AUDIT_TRACE_OUT, get_audit_trace,
        ),
        Tool(
            "create_draft", "Draft an automation from a prompt",
            "Draft an automation definition from a plain-language prompt (or, with automation_id, a new "
            "version of an existing one: the draft carries a diff). The platform's language model writes it, "
            "it is validated as a save would be, and a reviewer pass adds a plain-language summary and flags "
            "(short schedules, external writes, cost, new capabilities). The draft is only a proposal that "
            "expires: saving it takes a person's explicit action outside this server. Answers "
            "LLM_NOT_CONFIGURED when the platform has no language model. Needs the operator role.",
            schemas.CREATE_DRAFT_IN, schemas.CREATE_DRAFT_OUT, create_draft,
            read_only=False, idempotent=False, open_world=True,
        ),
    ]
}  # fmt: skip
_VALIDATORS = {name: tool.validator() for name, tool in TOOLS.items()}


# --- the one way in -----------------------------------------------------------------------


def _check_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ServiceError("INVALID_ARGUMENT", "arguments must be a JSON object")
    try:
        size = len(json.dumps(arguments, cls=DjangoJSONEncoder))
    except (TypeError, ValueError):
        raise ServiceError("INVALID_ARGUMENT", "arguments must be JSON") from None
    if size > MAX_ARGUMENT_BYTES:
        raise ServiceError("PAYLOAD_TOO_LARGE", f"arguments are larger than {MAX_ARGUMENT_BYTES} bytes", 413)
    problems = [
        {"path": "/" + "/".join(str(p) for p in e.absolute_path), "code": "INVALID_ARGUMENT",
         "message": e.message[:300]}
        for e in _VALIDATORS[tool.name].iter_errors(arguments)
    ]  # fmt: skip
    if problems:
        raise InvalidArgument(problems, "arguments do not match the tool's input schema")
    return arguments


def _audit(call: Call, name: str, arguments: Any, error: ServiceError | None) -> None:
    actor = writer.actor_for(call.user)
    summary = f"{actor} called {name[:64]} via MCP" + (f": {error.code}" if error else "")
    payload = {"via": "mcp", "tool": name, "arguments": arguments if isinstance(arguments, dict) else None}
    if error is not None:
        payload["error"] = {"code": error.code, "message": error.message}
    trace_id = call.trace_id or uuid.uuid4().hex
    workspace_ids: list[int | None] = [*sorted(call.workspace_ids)] or [None]  # None: one unscoped row
    with transaction.atomic():
        for workspace_id in workspace_ids:
            writer.append(
                trace_id=trace_id, type=AUDIT_TYPE, summary=summary, workspace_id=workspace_id, actor=actor,
                outcome=Outcome.FAILURE if error else Outcome.SUCCESS, refs=call.refs, payload=payload,
            )  # fmt: skip


def tool_call(*, user, name: str, arguments: Any) -> dict[str, Any]:
    """Run one tool as ``user``; return its JSON result or raise ``ServiceError``. Audited either way."""
    call = Call(user=user)
    tool = TOOLS.get(name)
    try:
        if tool is None:
            raise UnknownTool(name)
        result = _jsonable(tool.handler(call, _check_arguments(tool, arguments)))
    except ServiceError as exc:
        _audit(call, name, arguments, exc)
        raise
    except (OperationalError, InterfaceError):
        # As the REST API answers (config/api_errors.py); the ledger is out of reach too.
        logger.warning("MCP tool %s: database unavailable", name, exc_info=True)
        raise database_unavailable() from None
    except Exception:
        logger.exception("MCP tool %s failed", name)
        error = ServiceError("INTERNAL", "internal error", 500)
        _audit(call, name, arguments, error)
        raise error from None
    _audit(call, name, arguments, None)
    return result
