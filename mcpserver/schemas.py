"""JSON Schemas of the MCP tools' inputs and outputs (pure data, no Django, no SDK).

Output shapes are the REST API's (the same serializers produce them), so a
model reads what ``GET /api/v1/...`` would show the same user. MCP clients
validate ``structuredContent`` against these, so they must stay true:
``tests/mcpserver/test_tools.py`` checks every tool's real output against them.
"""

from __future__ import annotations

from typing import Any

from automations.models import RunStatus, StepStatus

JSON = dict[str, Any]

ID: JSON = {"type": "string", "format": "uuid"}
TIME: JSON = {"type": ["string", "null"], "description": "ISO 8601, microseconds, UTC"}
MONEY: JSON = {"type": ["string", "number"], "description": "US dollars, decimal"}
ERROR: JSON = {
    "type": ["object", "null"],
    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
}
LIMIT: JSON = {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}


def obj(properties: JSON, required: list[str] | None = None, *, closed: bool = False, **extra: Any) -> JSON:
    schema: JSON = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    if closed:
        schema["additionalProperties"] = False
    return schema


AUTOMATION_SUMMARY = obj(
    {
        "id": ID,
        "name": {"type": "string"},
        "status": {"enum": ["active", "paused"]},
        "version": {"type": "integer"},
        "workspace": {"type": "string", "description": "workspace slug"},
        "updated_at": TIME,
    },
    ["id", "name", "status", "version", "workspace"],
)

AUTOMATION = obj(
    {
        "id": ID,
        "name": {"type": "string"},
        "status": {"enum": ["active", "paused"]},
        "version": {"type": "integer"},
        "definition": {
            "type": "object",
            "description": "the JSON definition (GET /api/v1/schema/definition)",
        },
        "workspace": {"type": "string"},
        "effective_autonomy": {
            "enum": ["A0", "A1", "A2", "A3", "A4"],
            "description": "the autonomy its steps are gated at: its own (else the workspace default), "
            "never above the workspace's max_autonomy",
        },
        "notices": {
            "type": "array",
            "items": {"type": "object"},
            "description": "what the workspace's ceilings change (autonomy_clamped, approvals_raised)",
        },
        "created_at": TIME,
        "updated_at": TIME,
    },
    ["id", "name", "status", "version", "definition", "workspace"],
)

TRIGGER = obj(
    {
        "id": ID,
        "key": {"type": "string"},
        "type": {"enum": ["schedule", "webhook", "event"]},
        "config": {"type": "object"},
        "enabled": {"type": "boolean"},
        "last_fired_at": TIME,
        "next_fire_at": TIME,
        "has_token": {"type": "boolean"},
        "has_signing_secret": {"type": "boolean"},
    },
    ["id", "key", "type", "config", "enabled"],
)

RUN_SUMMARY = obj(
    {
        "id": ID,
        "automation": ID,
        "status": {"enum": RunStatus.values},
        "trigger_type": {"type": "string"},
        "error": {},
        "cost_usd": MONEY,
        "trace_id": {"type": "string"},
        "created_at": TIME,
        "started_at": TIME,
        "finished_at": TIME,
    },
    ["id", "automation", "status", "trace_id", "created_at"],
)

STEP = obj(
    {
        "step_id": {"type": "string"},
        "phase": {"enum": ["plan", "on_failure"]},
        "action": {"type": "string"},
        "status": {"enum": StepStatus.values},
        "attempt": {"type": "integer"},
        "config": {"description": "the rendered config (secrets redacted), null until rendered"},
        "output": {"description": "the result envelope (secrets redacted), null until finished"},
        "error": ERROR,
        "cost_usd": MONEY,
        "started_at": TIME,
        "finished_at": TIME,
        "duration_ms": {"type": ["number", "null"]},
    },
    ["step_id", "status", "attempt", "error"],
)

RUN = obj(
    {
        "id": ID,
        "automation": ID,
        "automation_version": {"type": "integer"},
        "workspace": {"type": "string"},
        "status": {"enum": RunStatus.values},
        "trigger_type": {"type": "string"},
        "trigger_key": {"type": "string"},
        "triggered_by": {"type": "string"},
        "inputs": {"type": "object"},
        "steps": {
            "type": "array",
            "items": STEP,
            "description": "plan steps in order, then on_failure steps",
        },
        "output": {"description": "the run's output, null until it succeeded"},
        "error": ERROR,
        "cost_usd": MONEY,
        "trace_id": {"type": "string", "description": "pass to get_audit_trace"},
        "parent_run": {"type": ["string", "null"]},
        "queue": {"type": "string"},
        "created_at": TIME,
        "started_at": TIME,
        "finished_at": TIME,
    },
    ["id", "automation", "status", "steps", "output", "error", "trace_id"],
)

APPROVAL = obj(
    {
        "id": ID,
        "workspace": {"type": "string"},
        "run_id": {"type": "string"},
        "automation_id": {"type": "string"},
        "automation_name": {"type": "string"},
        "step_id": {"type": "string"},
        "action": {"type": "string"},
        "capability_id": {"type": "string"},
        "status": {"type": "string"},
        "risk": {"enum": ["low", "medium", "high", "critical"]},
        "reasons": {"type": "array"},
        "what": {"description": "the exact rendered payload that would run (secrets redacted)"},
        "why": {"type": "string"},
        "message": {"type": "string"},
        "approvals_required": {"type": "integer"},
        "approvals_count": {"type": "integer"},
        "expires_at": TIME,
        "created_at": TIME,
    },
    ["id", "run_id", "step_id", "status", "risk", "what", "why", "expires_at"],
)

AUDIT_EVENT = obj(
    {
        "id": {"type": "integer"},
        "timestamp": TIME,
        "trace_id": {"type": "string"},
        "type": {"type": "string"},
        "summary": {"type": "string"},
        "outcome": {"enum": ["success", "failure", "suppressed", "info"]},
        "refs": {"type": "object"},
        "actor": {"type": "string"},
        "payload": {"type": "object"},
        "hash": {"type": ["string", "null"], "description": "null until the sequencer chains the event"},
        "prev_hash": {"type": ["string", "null"]},
        "seq": {"type": ["integer", "null"]},
        "chain": {"type": "string"},
    },
    ["id", "timestamp", "trace_id", "type", "summary", "outcome", "actor"],
)

# --- inputs and outputs per tool ------------------------------------------------------

LIST_AUTOMATIONS_IN = obj(
    {
        "search": {"type": "string", "maxLength": 200, "description": "case-insensitive part of the name"},
        "status": {"enum": ["active", "paused"]},
        "limit": {**LIMIT, "default": 50},
        "offset": {"type": "integer", "minimum": 0, "default": 0},
    },
    closed=True,
)
LIST_AUTOMATIONS_OUT = obj(
    {"count": {"type": "integer", "description": "matches in total"},
     "automations": {"type": "array", "items": AUTOMATION_SUMMARY}},
    ["count", "automations"],
)  # fmt: skip

DESCRIBE_AUTOMATION_IN = obj({"automation_id": ID}, ["automation_id"], closed=True)
DESCRIBE_AUTOMATION_OUT = obj(
    {
        "automation": AUTOMATION,
        "inputs_schema": {
            "type": "object",
            "description": "JSON Schema that run_automation's inputs must match",
        },
        "triggers": {"type": "array", "items": TRIGGER},
        "last_runs": {"type": "array", "items": RUN_SUMMARY, "description": "newest first"},
    },
    ["automation", "inputs_schema", "triggers", "last_runs"],
)

RUN_AUTOMATION_IN = obj(
    {
        "automation_id": ID,
        "inputs": {"type": "object", "default": {}, "description": "must match the automation's inputs_schema"},
        "idempotency_key": {
            "type": "string", "minLength": 1, "maxLength": 255,
            "description": "the same key with the same inputs returns the original run (24 h) instead of a new one",
        },
    },
    ["automation_id"],
    closed=True,
)  # fmt: skip
RUN_AUTOMATION_OUT = obj(
    {
        "run_id": {"type": ["string", "null"], "description": "null when suppressed"},
        "status": {"type": ["string", "null"]},
        "status_url": {"type": ["string", "null"], "description": "the REST API URL of the run"},
        "deduplicated": {"type": "boolean", "description": "true: an earlier run with this idempotency key"},
        "suppressed": {"type": "boolean", "description": "true: dropped, a run is already active"},
    },
    ["run_id", "status", "deduplicated", "suppressed"],
)

GET_RUN_IN = obj({"run_id": ID}, ["run_id"], closed=True)
GET_RUN_OUT = RUN

LIST_APPROVALS_IN = obj(
    {"automation_id": ID, "run_id": ID, "limit": LIMIT},
    closed=True,
)
LIST_APPROVALS_OUT = obj(
    {"count": {"type": "integer"}, "approvals": {"type": "array", "items": APPROVAL}}, ["count", "approvals"]
)

AUDIT_TRACE_IN = obj(
    {
        "trace_id": {
            "type": "string",
            "pattern": "^[A-Za-z0-9_.:-]{1,64}$",
            "description": "a run's trace_id",
        },
        "type": {
            "type": "string",
            "maxLength": 64,
            "description": "only events of this type, e.g. step.succeeded",
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 200},
    },
    ["trace_id"],
    closed=True,
)
AUDIT_TRACE_OUT = obj(
    {
        "trace_id": {"type": "string"},
        "count": {"type": "integer", "description": "events of the trace in total"},
        "events": {"type": "array", "items": AUDIT_EVENT, "description": "oldest first"},
    },
    ["trace_id", "count", "events"],
)

CREATE_DRAFT_IN = obj(
    {
        "prompt": {"type": "string", "minLength": 1, "maxLength": 8000,
                   "description": "what the automation should do, in plain language"},
        "automation_id": {**ID, "description": "draft a new version of this automation (the draft shows a diff)"},
        "workspace": {"type": "string", "maxLength": 64, "description": "slug; needed if you operate several"},
    },
    ["prompt"],
    closed=True,
)  # fmt: skip
CREATE_DRAFT_OUT = obj(
    {
        "id": ID,
        "workspace": {"type": "string"},
        "automation": {"type": ["string", "null"], "description": "the automation this draft edits"},
        "status": {"type": "string"},
        "model": {"type": "string"},
        "definition": {"type": "object", "description": "valid against GET /api/v1/schema/definition"},
        "validation": {"type": "object"},
        "summary": {"type": "string", "description": "the reviewer's plain-language summary"},
        "flags": {"type": "array", "description": "things a person should look at before saving"},
        "diff": {"type": "string"},
        "cost_usd": MONEY,
        "expires_at": TIME,
    },
    ["id", "workspace", "status", "definition", "summary", "flags", "expires_at"],
)

ERROR_RESULT = obj(
    {
        "error": obj(
            {"code": {"type": "string"}, "message": {"type": "string"},
             "errors": {"type": "array", "description": "validation problems, {path, code, message}"}},
            ["code", "message"],
        )
    },
    ["error"],
)  # fmt: skip
