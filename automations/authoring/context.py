"""What the drafting model is told, and how its answers are read (SPEC §10).

The generator sees exactly: the user's prompt, the definition schema, the
action and capability registries (names, descriptions, schemas, risk), and
the workspace's resource *names* — credential names, automation names, event
types. Never a secret value, a credential's kind or metadata, a run, a step
output or an event payload: nothing of the kind is read here, so a prompt
that asks for credentials has nothing to reveal.

Everything the model returns is untrusted data: parsed as JSON, validated
like any definition a person typed, shown to a human, and saved only by one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from capabilities import registry
from capabilities.credentials import credential_names
from workspaces.models import Workspace

from .. import definition as defs
from ..models import Automation, DomainEvent

MAX_NAMES = 200
MAX_ANSWER_ECHO = 4000

GENERATOR_RULES = """\
You write automation definitions for autoplane, an automation control plane.
Answer with ONE JSON object: the complete definition. No prose, no markdown fences.
Rules:
- It must validate against the definition JSON Schema below (schema_version "1.0").
- Steps run in order; each names an action from the action list and a config matching its config_schema.
- Strings in step configs may be Jinja templates: {{ inputs.x }}, {{ trigger.y }}, {{ <output_as name> }}, \
{{ run.id }}. Only these filters: join length default upper lower truncate tojson date replace trim slugify \
first last sort reverse abs round int float string. No attributes starting with "_".
- Never put secrets in a definition. Refer to credentials only by name, from the workspace's credential list; \
if the user needs one that does not exist, still name it (a human will create it).
- Prefer the tightest action: http_request, transform_data, emit_event or send_email over agent_task; use \
agent_task only when judgement over text is needed, with the narrowest tools allowlist and a budget_cap_usd.
- call_capability and agent_task tools may name only capabilities from the capability list.
"""

REVIEWER_RULES = """\
You review an automation definition that a model drafted, for the human who will decide whether to save it.
Answer with ONE JSON object: {"summary": "<plain-language description of what it does, when, and what it \
touches, at most 120 words>", "flags": [{"kind": "<kind>", "path": "<JSON pointer>", "message": "<why a human \
should look>"}]}.
Flag kinds: schedule_under_15_min, agent_task (an LLM step where a tight action would do), external_write, \
cost, new_capability, missing_credential, other. No prose outside the JSON.
"""


def resource_names(workspace: Workspace) -> dict[str, list[str]]:
    """The workspace's resource names (never their contents)."""
    events = DomainEvent.objects.filter(workspace=workspace).values_list("event_type", flat=True).distinct()
    return {
        "credentials": sorted(credential_names(workspace.id))[:MAX_NAMES],
        "automations": list(
            Automation.objects.filter(workspace=workspace)
            .order_by("name")
            .values_list("name", flat=True)[:MAX_NAMES]
        ),
        "event_types": sorted(set(events[: MAX_NAMES * 5]))[:MAX_NAMES],
    }


def registry_digest(workspace_id: int) -> dict[str, Any]:
    """Actions and capabilities as the model needs them: what exists and what each takes."""
    actions = [
        {"name": a.name, "description": a.description, "config_schema": a.config_schema}
        for a in registry.all_actions()
    ]
    capabilities = [
        {
            "id": c.id,
            "description": c.description[:500],
            "input_schema": c.input_schema,
            "risk": c.risk.label,
            "side_effects": sorted(c.side_effects),
        }
        for c in registry.list_capabilities(workspace_id)
    ]
    return {"actions": actions, "capabilities": capabilities}


def generator_messages(
    *, workspace: Workspace, prompt: str, current: Mapping[str, Any] | None
) -> list[dict[str, str]]:
    reference = {
        "definition_schema": defs.definition_json_schema(),
        **registry_digest(workspace.id),
        "workspace": resource_names(workspace),
    }
    system = GENERATOR_RULES + "\nReference (JSON):\n" + json.dumps(reference, separators=(",", ":"))
    if current is None:
        user = f"Write an automation for this request:\n{prompt}"
    else:
        user = (
            "Here is the current definition:\n"
            + json.dumps(current, indent=1)
            + f"\n\nChange it as requested and return the complete new definition:\n{prompt}"
        )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def feedback_message(problems: list[dict[str, str]]) -> dict[str, str]:
    lines = "\n".join(f"- {p['path']}: {p['message']} ({p['code']})" for p in problems[:50])
    return {
        "role": "user",
        "content": "That answer was refused by validation:\n"
        + lines
        + "\nReturn the complete corrected definition as one JSON object.",
    }


def echo(answer: str) -> dict[str, str]:
    """The model's previous answer, as it goes back into the conversation (capped)."""
    return {"role": "assistant", "content": answer[:MAX_ANSWER_ECHO]}


def reviewer_messages(*, prompt: str, definition: Mapping[str, Any]) -> list[dict[str, str]]:
    user = f"The request was:\n{prompt}\n\nThe drafted definition:\n{json.dumps(definition, indent=1)}"
    return [{"role": "system", "content": REVIEWER_RULES}, {"role": "user", "content": user}]


def parse_json_object(text: str | None) -> dict[str, Any] | None:
    """The JSON object in a model's answer (tolerating a markdown fence around it), or None."""
    if not text:
        return None
    body = text.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        body = body.rsplit("```", 1)[0]
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
