"""``require_approval``: an explicit human checkpoint. The engine always gates it; running it is a no-op."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import ActionContext, ActionDefinition, Capability, Envelope, Risk

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["message"],
    "additionalProperties": False,
    "properties": {
        "message": {"type": "string", "minLength": 1, "maxLength": 2000},
        "approvals_required": {"type": "integer", "minimum": 1, "maximum": 5},
    },
}

PROFILE = Capability(id="require_approval", risk=Risk.LOW, idempotent=True, expected_duration_seconds=0.01)


def describe(config: Mapping[str, Any]) -> Capability:
    return PROFILE


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    return Envelope.success({"message": config["message"]}, summary="approved")


ACTION = ActionDefinition(
    name="require_approval",
    description="Pause for explicit human approval with a message.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    always_asks_human=True,
    approver_message=lambda config: str(config.get("message", "")),
)
