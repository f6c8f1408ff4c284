"""``emit_event``: publish a domain event other automations can trigger on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import (
    ActionContext,
    ActionDefinition,
    Capability,
    Envelope,
    ErrorCode,
    Risk,
    SideEffect,
    StepFailure,
)

# Event types the platform itself publishes (``approval.requested``, ``automation.run.succeeded`` /
# ``failed``): triggers on them believe the platform, so nobody else may publish them, neither
# ``POST /api/v1/events`` nor a step (``emit_event``, also as an agent tool).
RESERVED_EVENT_PREFIXES = ("approval.", "automation.")
RESERVED_MESSAGE = "event types starting with 'approval.' or 'automation.' are published by the platform only"


def reserved_event_type(event_type: str) -> bool:
    return event_type.startswith(RESERVED_EVENT_PREFIXES)


CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["event_type", "payload"],
    "additionalProperties": False,
    "properties": {
        "event_type": {"type": "string", "pattern": "^[a-z0-9_.-]{1,128}$"},
        "payload": {"type": "object"},
    },
}

# Not idempotent: publishing twice fires every subscriber twice.
PROFILE = Capability(
    id="emit_event",
    side_effects=frozenset({SideEffect.WRITE}),
    risk=Risk.LOW,
    idempotent=False,
    expected_duration_seconds=0.05,
)


def describe(config: Mapping[str, Any]) -> Capability:
    return PROFILE


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    event_type = config.get("event_type")
    if isinstance(event_type, str) and reserved_event_type(event_type):
        return [("/event_type", "reserved_event_type", RESERVED_MESSAGE)]
    return []


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    if ctx.publish_event is None:
        raise StepFailure(ErrorCode.INTERNAL, "events cannot be published here")
    event_type = config["event_type"]
    if reserved_event_type(event_type):
        raise StepFailure(
            ErrorCode.POLICY_VIOLATION, f"'{event_type[:128]}': {RESERVED_MESSAGE}", retryable=False
        )
    event_id = ctx.publish_event(event_type, dict(config["payload"]))
    return Envelope.success({"event_id": event_id}, summary=f"published {event_type}")


ACTION = ActionDefinition(
    name="emit_event",
    description="Publish a domain event (composition between automations).",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    validate=validate,
    handler=handler,
    as_tool=True,
)
