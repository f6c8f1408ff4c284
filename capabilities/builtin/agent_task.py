"""``agent_task``: an LLM with a tool allowlist and an output schema (SPEC §5, §10).

The loop: ask the model (the rendered ``prompt``, optional ``system``, the
allowlisted tools); answer each tool call through ``ctx.call_tool`` — which
the engine gates, approves and audits like a step calling that capability,
and which raises ``AwaitingApproval`` to park the run (the conversation is
kept with ``ctx.save_state`` and resumed from ``ctx.resume_state``); feed a
final answer that fails ``output_schema`` back for repair; stop after
``max_turns`` model calls. A tool the allowlist does not match is never
called: the model is told so and nothing else happens.

Every model call is checked against the run's budget first and charged to
``ctx.cost_meter`` after (token prices from ``LLM_PRICES``); the meter raises
``BUDGET_EXCEEDED``. The model's text is data: it is parsed and validated,
never rendered as a template.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from django.conf import settings

from .. import json_schema, llm, tools
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

DEFAULT_MAX_TURNS = 8
MAX_TOOL_RESULT_CHARS = 16_000
MAX_FEEDBACK_ERRORS = 10

ToolCaller = Callable[[str, Mapping[str, Any], str], Envelope]  # ActionContext.call_tool

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["prompt"],
    "additionalProperties": False,
    "properties": {
        "prompt": {"type": "string", "minLength": 1, "maxLength": 32_000},
        "system": {"type": "string", "maxLength": 32_000},
        "tools": {
            "type": "array",
            "maxItems": 50,
            "items": {"type": "string", "pattern": "^[a-zA-Z0-9_.*?\\[\\]-]{1,200}$"},
        },
        "output_schema": {"type": "object"},
        "max_turns": {"type": "integer", "minimum": 1, "maximum": 50},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 200_000},
    },
}


def describe(config: Mapping[str, Any]) -> Capability:
    # The step itself only spends tokens; each tool call is gated on its own.
    has_tools = bool(config.get("tools"))
    effects = {SideEffect.COST_INCURRING} | ({SideEffect.EXTERNAL_WRITE} if has_tools else set())
    return Capability(
        id="agent_task",
        description="LLM with a tool allowlist",
        side_effects=frozenset(effects),
        risk=Risk.LOW,
        idempotent=not has_tools,
        expected_duration_seconds=120.0,
        cost_estimate=estimate_cost,
    )


def estimate_cost(config: Mapping[str, Any]) -> Decimal:
    """The least one model call can cost: the prompt (~4 characters a token) and ``max_tokens`` of answer."""
    characters = len(str(config.get("prompt", ""))) + len(str(config.get("system", "")))
    usage = llm.Usage(prompt_tokens=characters // 4, completion_tokens=int(config.get("max_tokens") or 0))
    return llm.cost_usd(settings.LLM_MODEL, usage)


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    schema = config.get("output_schema")
    if isinstance(schema, dict):
        problem = json_schema.schema_problem(schema)
        if problem is not None:
            return [("/output_schema" + problem[0], "invalid_output_schema",
                     f"not a valid JSON Schema: {problem[1]}")]  # fmt: skip
    return []


def _initial_state(config: Mapping[str, Any]) -> dict[str, Any]:
    messages = []
    system = config.get("system") or ""
    if config.get("output_schema") is not None:
        system += (
            ("\n\n" if system else "")
            + "Give your final answer as JSON matching this schema: "
            + json.dumps(config["output_schema"])
        )
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": config["prompt"]})
    return {"messages": messages, "turns": 0, "calls": 0, "pending": [],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0}}  # fmt: skip


def _final_answer(content: str | None, schema: Mapping[str, Any] | None) -> tuple[Any, list[str]]:
    """(data, problems): the answer as data, or what is wrong with it."""
    if schema is None:
        return (content or ""), []
    text = (content or "").strip()
    if text.startswith("```"):
        text = text.split("\n", 1)[1].rsplit("```", 1)[0] if "\n" in text else ""
    try:
        data = json.loads(text)
    except ValueError:
        return None, ["the answer is not JSON"]
    problems = [f"/{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
                for e in json_schema.validator(schema).iter_errors(data)]  # fmt: skip
    return data, problems[:MAX_FEEDBACK_ERRORS]


def _tool_result(call_tool: ToolCaller, call: Mapping[str, str], names: Mapping[str, str]) -> Envelope:
    tool_id = names.get(call["name"], call["name"] if call["name"] in names.values() else None)
    if tool_id is None:
        envelope = Envelope.failure(ErrorCode.POLICY_VIOLATION,
                                    f"'{call['name'][:100]}' is not a tool this step may call", retryable=False)  # fmt: skip
    else:
        try:
            args = json.loads(call["arguments"] or "{}")
        except ValueError:
            args = None
        if not isinstance(args, dict):
            envelope = Envelope.failure(ErrorCode.INVALID_ARGUMENT, "tool arguments must be a JSON object",
                                        retryable=False)  # fmt: skip
        else:
            envelope = call_tool(tool_id, args, call["key"])
    return envelope


def _client(ctx: ActionContext) -> llm.LlmClient:
    if ctx.resolve_llm is None:
        raise StepFailure(ErrorCode.INTERNAL, "no LLM can be used here")
    try:
        return ctx.resolve_llm()
    except llm.LlmNotConfigured as exc:
        raise StepFailure(
            ErrorCode.TEMPORARILY_UNAVAILABLE, f"{exc.code}: no LLM is configured", retryable=False
        )


def _cancelled(what: str) -> StepFailure:
    return StepFailure(ErrorCode.CANCELLED, what, retryable=False)


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    call_tool = ctx.call_tool
    if call_tool is None:
        raise StepFailure(ErrorCode.INTERNAL, "tools cannot be called here")
    # A cancel shuts the model call in flight down (its connections are the step's own), and a
    # tool in flight stops as that tool's own step would (a sandbox killed, an HTTP call abandoned).
    with _client(ctx).interruptible(ctx.cancelled) as client:
        return _converse(ctx, config, client, call_tool)


def _converse(
    ctx: ActionContext, config: Mapping[str, Any], client: llm.LlmClient, call_tool: ToolCaller
) -> Envelope:
    deadline = time.monotonic() + ctx.timeout_seconds
    specs, names = tools.function_specs(tools.tools_matching(config.get("tools") or [], ctx.workspace_id))
    schema = config.get("output_schema")
    max_turns = int(config.get("max_turns", DEFAULT_MAX_TURNS))
    state = ctx.resume_state or _initial_state(config)
    while True:
        while state["pending"]:
            ctx.save_state(state)  # a tool call may park the run: resume from here
            call = state["pending"][0]
            envelope = _tool_result(call_tool, call, names)
            if ctx.cancelled.is_set():
                error = (envelope.error or {}).get("message") or "it was not called"
                raise _cancelled(
                    f"turn {state['turns']}: tool call {call['name'][:100]} was interrupted: {error}"
                )
            content = json.dumps(envelope.as_dict(), default=str)[:MAX_TOOL_RESULT_CHARS]
            state["messages"].append({"role": "tool", "tool_call_id": call["id"], "content": content})
            state["pending"].pop(0)
        if state["turns"] >= max_turns:
            raise StepFailure(ErrorCode.INVALID_ARGUMENT,
                              f"the model gave no acceptable final answer in {max_turns} turns", retryable=False)  # fmt: skip
        if ctx.cancelled.is_set() or ctx.cancel_requested():
            raise _cancelled(f"cancelled between turns, after turn {state['turns']}")
        ctx.cost_meter.check()
        try:
            completion = client.chat(state["messages"], tools=specs or None, max_tokens=config.get("max_tokens"),
                                     deadline=deadline)  # fmt: skip
        except llm.LlmError as exc:
            if exc.code == ErrorCode.CANCELLED:
                raise _cancelled(f"turn {state['turns'] + 1}: {exc.message}") from exc
            raise StepFailure(exc.code, exc.message, retryable=exc.retryable, detail=exc.detail)
        state["turns"] += 1
        for name, count in completion.usage.as_dict().items():
            state["usage"][name] += count
        ctx.cost_meter.charge(llm.cost_usd(client.model, completion.usage), f"llm turn {state['turns']}",
                              usage=completion.usage.as_dict())  # fmt: skip
        state["messages"].append(completion.assistant_message())
        if completion.tool_calls:
            state["pending"] = [{"id": c.id, "name": c.name, "arguments": c.arguments, "key": f"t{state['calls'] + i}"}
                                for i, c in enumerate(completion.tool_calls)]  # fmt: skip
            state["calls"] += len(completion.tool_calls)
            continue
        data, problems = _final_answer(completion.content, schema)
        if not problems:
            usage = {**state["usage"], "turns": state["turns"], "tool_calls": state["calls"]}
            return Envelope.success(data, summary=f"answered in {state['turns']} turn(s)", usage=usage)
        state["messages"].append({"role": "user", "content": "Your final answer does not match the output schema:\n"
                                  + "\n".join(problems) + "\nAnswer again with only the corrected JSON."})  # fmt: skip


ACTION = ActionDefinition(
    name="agent_task",
    description="An LLM with a tool allowlist (capability globs) and an output_schema; tokens are charged to "
    "the run's budget.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
    uses=lambda config: [str(t) for t in config.get("tools") or []],
    model_driven=True,
)
