"""Name → implementation, as literal mappings of dotted paths, loaded lazily.

Actions are what steps name. Native capabilities are what ``call_capability``
can call besides harvested MCP tools (looked up through ``external_lookup``,
which the MCP module registers in ``CapabilitiesConfig.ready``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import import_module

from .base import ActionDefinition, Capability

ACTIONS: dict[str, str] = {
    "transform_data": "capabilities.builtin.transform_data.ACTION",
    "emit_event": "capabilities.builtin.emit_event.ACTION",
    "http_request": "capabilities.builtin.http_request.ACTION",
    "send_email": "capabilities.builtin.send_email.ACTION",
    "wait": "capabilities.builtin.wait.ACTION",
    "call_capability": "capabilities.builtin.call_capability.ACTION",
    "require_approval": "capabilities.builtin.require_approval.ACTION",
    "ask_human": "capabilities.builtin.ask_human.ACTION",
    "run_python": "capabilities.builtin.code.RUN_PYTHON",
    "run_shell": "capabilities.builtin.code.RUN_SHELL",
    "agent_task": "capabilities.builtin.agent_task.ACTION",
}

NATIVE_CAPABILITIES: dict[str, str] = {
    "core.echo": "capabilities.builtin.native.ECHO",
    "core.http_get": "capabilities.builtin.native.HTTP_GET",
}

# (capability_id, workspace_id) -> Capability | None, for capabilities kept in
# the database (MCP tools). Set once at start-up.
external_lookup: Callable[[str, int], Capability | None] | None = None
external_listing: Callable[[int], list[Capability]] | None = None
# (capability_id, workspace_id) -> why a capability that exists may not be called now
# (an MCP tool whose definition changed since it was approved), else None.
external_held: Callable[[str, int], str | None] | None = None


def _load(dotted: str):
    # A listed module that fails to import is a bug: let it raise, never hide an action.
    module, _, attr = dotted.rpartition(".")
    return getattr(import_module(module), attr)


@cache
def get_action(name: str) -> ActionDefinition | None:
    dotted = ACTIONS.get(name)
    return _load(dotted) if dotted else None


def action_names() -> list[str]:
    return [name for name in ACTIONS if get_action(name) is not None]


def all_actions() -> list[ActionDefinition]:
    return [action for name in ACTIONS if (action := get_action(name)) is not None]


@cache
def get_native_capability(capability_id: str) -> Capability | None:
    dotted = NATIVE_CAPABILITIES.get(capability_id)
    return _load(dotted) if dotted else None


def get_capability(capability_id: str, workspace_id: int) -> Capability | None:
    native = get_native_capability(capability_id)
    if native is not None:
        return native
    if external_lookup is not None:
        return external_lookup(capability_id, workspace_id)
    return None


def held_reason(capability_id: str, workspace_id: int) -> str | None:
    """Why a capability that exists is held back (a policy matter, not a missing one), else None."""
    if external_held is None or not isinstance(capability_id, str):
        return None
    return external_held(capability_id, workspace_id)


def list_capabilities(workspace_id: int) -> list[Capability]:
    native = [cap for cid in NATIVE_CAPABILITIES if (cap := get_native_capability(cid)) is not None]
    external = external_listing(workspace_id) if external_listing is not None else []
    return native + external
