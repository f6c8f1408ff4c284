"""Items a human should look at before saving a draft, found without the model.

The reviewer model adds its own flags, but every kind below is also checked
here, deterministically, so no flag depends on the model: schedules under
15 minutes, ``agent_task`` steps (an LLM where a tight action might do),
external writes, cost (cost-incurring steps, LLM steps, a missing budget
cap), capabilities the workspace has not used before, and credentials the
workspace does not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from capabilities.base import SideEffect

from .. import definition as defs

KINDS = frozenset(
    {"schedule_under_15_min", "agent_task", "external_write", "cost", "new_capability", "missing_credential",
     "other"}
)  # fmt: skip
SHORT_SCHEDULE_SECONDS = 15 * 60
MAX_FLAG_MESSAGE = 500
MAX_REVIEWER_FLAGS = 20


def _flag(kind: str, path: str, message: str, source: str = "check") -> dict[str, str]:
    return {"kind": kind, "path": path, "message": message[:MAX_FLAG_MESSAGE], "source": source}


def _steps(definition: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    for i, step in enumerate(definition.get("plan") or []):
        yield f"/plan/{i}", step
    for i, step in enumerate((definition.get("execution") or {}).get("on_failure") or []):
        yield f"/execution/on_failure/{i}", step


def capabilities_used(definition: Mapping[str, Any]) -> set[str]:
    """Actions, called capabilities and agent tool patterns a definition names."""
    used: set[str] = set()
    for _, step in _steps(definition):
        used.add(str(step.get("action")))
        action = defs.action_of(step)
        if action is not None:
            used.update(action.uses(step.get("config") or {}))
    return used


def deterministic_flags(
    definition: Mapping[str, Any],
    *,
    workspace_id: int,
    known_capabilities: set[str],
    missing_credentials: list[dict[str, str]],
) -> list[dict[str, str]]:
    flags: list[dict[str, str]] = []
    for i, trigger in enumerate(definition.get("triggers") or []):
        cron = (trigger.get("config") or {}).get("cron")
        if trigger.get("type") == "schedule" and isinstance(cron, str):
            seconds = defs.min_cron_interval_seconds(cron)
            if seconds < SHORT_SCHEDULE_SECONDS:
                flags.append(_flag("schedule_under_15_min", f"/triggers/{i}/config/cron",
                                   f"fires every {seconds / 60:g} min"))  # fmt: skip
    costly = False
    for path, step in _steps(definition):
        step_id = step.get("step_id")
        action = defs.action_of(step)
        if action is not None and action.model_driven:
            costly = True
            flags.append(_flag("agent_task", path, f"{step_id}: an LLM step (tokens cost money, answers vary); "
                                                   "check whether a tight action would do"))  # fmt: skip
        capability = defs.describe_step(step, workspace_id)
        if capability is None:
            continue
        if SideEffect.EXTERNAL_WRITE in capability.side_effects:
            flags.append(
                _flag("external_write", path, f"{step_id}: writes outside the platform ({capability.id})")
            )
        if SideEffect.COST_INCURRING in capability.side_effects:
            costly = True
            flags.append(_flag("cost", path, f"{step_id}: {capability.id} incurs cost"))
    execution = definition.get("execution") or {}
    if costly and "budget_cap_usd" not in execution:
        flags.append(_flag("cost", "/execution", "cost-incurring steps and no execution.budget_cap_usd"))
    for name in sorted(capabilities_used(definition) - known_capabilities):
        flags.append(
            _flag("new_capability", "/plan", f"'{name}' is not used by any automation in this workspace yet")
        )
    for problem in missing_credentials:
        flags.append(
            _flag("missing_credential", problem["path"], problem["message"] + "; create it before saving")
        )
    return flags


def combine(checked: list[dict[str, str]], reviewer: Any) -> list[dict[str, str]]:
    """Deterministic flags, then the reviewer's that add something (unknown kinds become ``other``)."""
    combined = list(checked)
    seen = {(f["kind"], f["path"]) for f in checked}
    for item in (reviewer if isinstance(reviewer, list) else [])[:MAX_REVIEWER_FLAGS]:
        if not isinstance(item, dict) or not isinstance(item.get("message"), str):
            continue
        # The reviewer's JSON is the model's: a kind may be a list, which `in KINDS` cannot hash.
        kind = item["kind"] if isinstance(item.get("kind"), str) and item["kind"] in KINDS else "other"
        path = item["path"][:200] if isinstance(item.get("path"), str) else "/"
        if (kind, path) in seen:
            continue
        seen.add((kind, path))
        combined.append(_flag(kind, path, item["message"], source="reviewer"))
    return combined
