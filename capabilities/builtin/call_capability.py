"""``call_capability``: call a capability (native or an MCP tool) by id with args.

Risk and side effects come from the *target*. ``describe`` has no workspace,
so it can only see native capabilities; for anything else it returns a
conservative placeholder (high risk, external write, not idempotent). The
definition's ``target`` looks the capability up in the run's workspace
(``registry.get_capability``), so the engine gates and validates the real
target; the placeholder is only what is left when it cannot.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import registry
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

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["capability"],
    "additionalProperties": False,
    "properties": {
        "capability": {"type": "string", "minLength": 1, "maxLength": 300},
        "args": {"type": "object"},
    },
}


def describe(config: Mapping[str, Any]) -> Capability:
    capability_id = str(config.get("capability", ""))
    native = registry.get_native_capability(capability_id)
    if native is not None:
        return native
    return Capability(
        id=capability_id or "call_capability",
        side_effects=frozenset({SideEffect.EXTERNAL_WRITE}),
        risk=Risk.HIGH,
        idempotent=False,
    )


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    if ctx.call_capability is None:
        raise StepFailure(ErrorCode.INTERNAL, "capabilities cannot be called here")
    return ctx.call_capability(config["capability"], dict(config.get("args") or {}))


ACTION = ActionDefinition(
    name="call_capability",
    description="Call any capability (including MCP tools) by id with args.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    target=lambda config, workspace_id: registry.get_capability(
        str(config.get("capability", "")), workspace_id
    ),
    target_args=lambda config: config.get("args") or {},
    uses=lambda config: [config["capability"]] if isinstance(config.get("capability"), str) else [],
)
