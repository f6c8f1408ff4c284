"""What an ``agent_task`` may call: capabilities and a few actions, by allowlist glob.

A tool is a native capability (``core.echo``), a harvested MCP tool
(``notes.search``) or an action whose definition says ``as_tool`` used as a capability (its config
is the tool's arguments, less the definition's ``tool_hidden_args``: ``http_request``
as a tool takes no ``credential``, as a model choosing both the URL and a
credential could send that credential anywhere; authenticated calls belong in
a step a human wrote).

The allowlist is a list of ``fnmatch`` globs over tool ids. The model sees
only the tools the allowlist matches, each under a function name the
OpenAI API accepts; the engine checks the allowlist again on every call.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import registry
from .base import ActionContext, ActionDefinition, Capability, Envelope

_FUNCTION_NAME = re.compile(r"[^a-zA-Z0-9_-]")


@dataclass(frozen=True)
class Tool:
    id: str
    description: str
    input_schema: Mapping[str, Any]
    describe: Callable[[Mapping[str, Any]], Capability]
    handler: Callable[[ActionContext, Mapping[str, Any]], Envelope]


def allowed(tool_id: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(tool_id, pattern) for pattern in patterns)


def _tool_actions() -> list[ActionDefinition]:
    return [action for action in registry.all_actions() if action.as_tool]


def _action_tool(action: ActionDefinition) -> Tool:
    schema = dict(action.config_schema)
    stripped = action.tool_hidden_args
    if stripped:
        schema["properties"] = {k: v for k, v in schema.get("properties", {}).items() if k not in stripped}
        schema["additionalProperties"] = False
    return Tool(id=action.name, description=action.description, input_schema=schema, describe=action.describe,
                handler=action.handler)  # fmt: skip


def _capability_tool(capability: Capability) -> Tool | None:
    if capability.handler is None:
        return None
    return Tool(id=capability.id, description=capability.description, input_schema=capability.input_schema,
                describe=lambda args: capability, handler=capability.handler)  # fmt: skip


def tool(tool_id: str, workspace_id: int) -> Tool | None:
    action = registry.get_action(tool_id)
    if action is not None and action.as_tool:
        return _action_tool(action)
    capability = registry.get_capability(tool_id, workspace_id)
    return _capability_tool(capability) if capability is not None else None


def tools_matching(patterns: Sequence[str], workspace_id: int) -> list[Tool]:
    candidates = [*(_action_tool(action) for action in _tool_actions()),
                  *(_capability_tool(c) for c in registry.list_capabilities(workspace_id))]  # fmt: skip
    return [t for t in candidates if t is not None and allowed(t.id, patterns)]


def function_specs(tools: Sequence[Tool]) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """OpenAI ``tools`` entries and the map from function name back to tool id."""
    specs: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for t in tools:
        name = _FUNCTION_NAME.sub("_", t.id)[:60]
        while name in names:
            name = name[:58] + f"_{len(names)}"
        names[name] = t.id
        specs.append({"type": "function", "function": {
            "name": name, "description": (t.description or t.id)[:1000], "parameters": dict(t.input_schema)}})  # fmt: skip
    return specs, names
