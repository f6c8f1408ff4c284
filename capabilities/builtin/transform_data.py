"""``transform_data``: the step's data is its (already rendered) ``output``, optionally reshaped by JMESPath."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jmespath
from jmespath.exceptions import JMESPathError

from ..base import ActionContext, ActionDefinition, Capability, Envelope, ErrorCode, Risk, StepFailure

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["output"],
    "additionalProperties": False,
    "properties": {
        "output": {},
        "jmespath": {"type": "string", "minLength": 1, "maxLength": 4000},
    },
}

PROFILE = Capability(id="transform_data", risk=Risk.LOW, idempotent=True, expected_duration_seconds=0.01)


def describe(config: Mapping[str, Any]) -> Capability:
    return PROFILE


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    expression = config.get("jmespath")
    # A templated expression can only be checked once rendered.
    if not isinstance(expression, str) or "{{" in expression or "{%" in expression:
        return []
    try:
        jmespath.compile(expression)
    except JMESPathError as exc:
        return [("/jmespath", "invalid_jmespath", f"invalid JMESPath expression: {exc}"[:300])]
    return []


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    output = config.get("output")
    expression = config.get("jmespath")
    if expression is None:
        return Envelope.success(output, summary="output built")
    try:
        data = jmespath.search(expression, output)
    except JMESPathError as exc:
        # Parse errors and runtime type errors (e.g. length(`1`)) alike.
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, "the JMESPath expression failed", detail=str(exc))
    return Envelope.success(data, summary="output reshaped with JMESPath")


ACTION = ActionDefinition(
    name="transform_data",
    description="Reshape data: the rendered `output`, optionally filtered through a JMESPath expression.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
)
