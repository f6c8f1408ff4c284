"""``ask_human``: a decision step. The engine always gates it (the question is an approval); the run
parks without holding a worker until someone answers (``POST /approvals/{id}/decide`` with
``"decision": "answer"``) or the question times out, which takes ``on_timeout``. Running it returns
the answer: ``{value, freetext, decided_by}`` for ``output_as`` and ``when``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import json_schema
from ..base import ActionContext, ActionDefinition, Capability, Envelope, ErrorCode, Risk

_VALUE = {"type": ["string", "number", "boolean"]}
CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["question", "timeout_seconds"],
    "additionalProperties": False,
    "properties": {
        "question": {"type": "string", "minLength": 1, "maxLength": 2000},
        "options": {
            "type": "array", "maxItems": 20,
            "items": {"type": "object", "required": ["value", "label"], "additionalProperties": False,
                      "properties": {"value": _VALUE, "label": {"type": "string", "minLength": 1, "maxLength": 200}}},
        },
        "allow_freetext": {"type": "boolean"},
        "input_schema": {"type": "object"},
        "timeout_seconds": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
        "on_timeout": _VALUE,
    },
}  # fmt: skip

PROFILE = Capability(id="ask_human", risk=Risk.LOW, idempotent=True, expected_duration_seconds=0.01)


def describe(config: Mapping[str, Any]) -> Capability:
    return PROFILE


def option_values(config: Mapping[str, Any]) -> list[Any]:
    return [option["value"] for option in config.get("options") or ()]


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    problems: list[tuple[str, str, str]] = []
    values = option_values(config)
    if not values and not config.get("allow_freetext") and "input_schema" not in config:
        problems.append(
            ("/options", "no_answer_possible", "offer options, allow free text or give an input_schema")
        )
    if len(set(map(repr, values))) != len(values):
        problems.append(("/options", "duplicate_option", "option values must be distinct"))
    if "on_timeout" not in config:
        problems.append(("/on_timeout", "missing_field", "say which option a timeout takes"))
    elif values and config["on_timeout"] not in values:
        problems.append(("/on_timeout", "unknown_option", "on_timeout must be one of the options' values"))
    if "input_schema" in config:
        # RE2 patterns, local $refs only: the answer is validated in a web thread (capabilities/json_schema.py).
        problem = json_schema.schema_problem(config["input_schema"])
        if problem is not None:
            pointer, message = problem
            problems.append(
                ("/input_schema" + pointer, "invalid_schema", f"not a valid JSON Schema: {message}")
            )
    return problems


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    answer = ctx.human_answer() if ctx.human_answer is not None else None
    if not answer:
        return Envelope.failure(ErrorCode.POLICY_VIOLATION, "the question has no answer", retryable=False)
    data = {"value": answer.get("value"), "freetext": answer.get("freetext") or "",
            "decided_by": answer.get("decided_by")}  # fmt: skip
    how = "timed out, took" if answer.get("timed_out") else "answered"
    return Envelope.success(data, summary=f"{how} {data['value']!r}"[:200])


ACTION = ActionDefinition(
    name="ask_human",
    description="Ask a person a question with options and/or free text; the run waits for the answer.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
    always_asks_human=True,
    approver_message=lambda config: str(config.get("question", "")),
)
