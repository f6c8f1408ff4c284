"""The :class:`~capabilities.base.ActionContext` a handler runs with (SPEC §5).

Everything privileged is a resolver called at use time: credentials (whose
values are collected for redaction), publishing events, calling another
capability, the LLM, the run's cancel flag; plus the engine-owned parts a
step call gets (its cost meter, the agent tool gateway, saved state).
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from approvals import selectors as approval_selectors
from capabilities import llm, registry
from capabilities.base import ActionContext, CostMeter, Envelope
from capabilities.credentials import credential_resolve

from . import events, transient
from .models import Run


def action_context(run: Run, step: dict[str, Any], attempt: int, key: str, timeout: float,
                   **extra: Any) -> ActionContext:  # fmt: skip
    """A handler's context; ``extra`` sets the engine-owned parts (cost meter, tool gateway, saved state)."""
    secrets: list[str] = []
    workspace = run.workspace

    def resolve_credential(
        name: str, *, destination: str | None = None, code_step: bool = False
    ) -> dict[str, Any]:
        value, secret_values = transient.with_retries(
            lambda: credential_resolve(workspace_id=run.workspace_id, name=name, automation_id=run.automation_id,
                                       destination=destination, code_step=code_step),
            f"run {run.pk}: resolving a credential",
        )  # fmt: skip
        secrets.extend(secret_values)
        return value

    def publish_event(event_type: str, payload: Mapping[str, Any]) -> str:
        return events.publish(
            workspace_id=run.workspace_id, event_type=event_type, payload=payload, source=f"run:{run.pk}",
            trace_id=run.trace_id, chain_depth=run.chain_depth + 1, parent_run_id=str(run.pk),
            actor=f"run:{run.pk}", principal_ids=run.principal_ids,
        )  # fmt: skip

    def call_capability(capability_id: str, args: Mapping[str, Any]) -> Envelope:
        capability = registry.get_capability(capability_id, run.workspace_id)
        if capability is None or capability.handler is None:
            held = registry.held_reason(capability_id, run.workspace_id)
            if held is not None:
                return Envelope.failure("POLICY_VIOLATION", held, retryable=False)
            return Envelope.failure(
                "CAPABILITY_NOT_FOUND", f"unknown capability '{capability_id}'", retryable=False
            )
        return capability.handler(ctx, args)

    ctx = ActionContext(
        run_id=str(run.pk),
        step_id=step["step_id"],
        attempt=attempt,
        workspace_id=run.workspace_id,
        trace_id=run.trace_id,
        idempotency_key=key,
        timeout_seconds=timeout,
        egress_allowlist=tuple(workspace.egress_allowlist or ()),
        resolve_credential=resolve_credential,
        publish_event=publish_event,
        call_capability=call_capability,
        # Reads a handler makes mid-call: a database blip waits, it does not fail the call.
        cancel_requested=lambda: transient.with_retries(
            Run.objects.filter(pk=run.pk, cancel_requested=True).exists, f"run {run.pk}: cancel check"
        ),
        secrets=secrets,
        resolve_llm=llm.require_llm,
        human_answer=lambda: approval_selectors.answer_for(run.pk, step["step_id"]),
        **extra,
    )
    return ctx


def cost_meter(run: Run) -> CostMeter:
    """A meter for one step call: what the run spent so far against its budget cap."""
    cap = (run.snapshot.get("execution") or {}).get("budget_cap_usd")
    return CostMeter(spent_before=Decimal(run.cost_usd), budget=None if cap is None else Decimal(str(cap)))
