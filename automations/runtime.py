"""What the executor needs from the rest of the platform: handler contexts,
the approval gate, timers, and releasing runs queued behind a finished one."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from approvals import gate as approval_gates
from approvals import policy
from audit import writer
from audit.redaction import redact
from capabilities import llm, registry
from capabilities.base import ActionContext, Capability, CostMeter, Envelope, Risk
from capabilities.credentials import credential_resolve

from . import events
from .definition import DEFAULT_AUTONOMY
from .models import Automation, Run, StepRun

logger = logging.getLogger(__name__)


def action_context(run: Run, step: dict[str, Any], attempt: int, key: str, timeout: float,
                   **extra: Any) -> ActionContext:  # fmt: skip
    """A handler's context; ``extra`` sets the engine-owned parts (cost meter, tool gateway, saved state)."""
    secrets: list[str] = []
    workspace = run.workspace

    def resolve_credential(
        name: str, *, destination: str | None = None, code_step: bool = False
    ) -> dict[str, Any]:
        value, secret_values = credential_resolve(workspace_id=run.workspace_id, name=name,
                                                  automation_id=run.automation_id, destination=destination,
                                                  code_step=code_step)  # fmt: skip
        secrets.extend(secret_values)
        return value

    def publish_event(event_type: str, payload: dict[str, Any]) -> str:
        return events.publish(
            workspace_id=run.workspace_id, event_type=event_type, payload=payload, source=f"run:{run.pk}",
            trace_id=run.trace_id, chain_depth=run.chain_depth + 1, parent_run_id=str(run.pk),
            actor=f"run:{run.pk}", principal_ids=run.principal_ids,
        )  # fmt: skip

    def call_capability(capability_id: str, args: dict[str, Any]) -> Envelope:
        capability = registry.get_capability(capability_id, run.workspace_id)
        if capability is None or capability.handler is None:
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
        cancel_requested=lambda: Run.objects.filter(pk=run.pk, cancel_requested=True).exists(),
        secrets=secrets,
        resolve_llm=llm.require_llm,
        **extra,
    )
    return ctx


def cost_meter(run: Run) -> CostMeter:
    """A meter for one step call: what the run spent so far against its budget cap."""
    cap = (run.snapshot.get("execution") or {}).get("budget_cap_usd")
    return CostMeter(spent_before=Decimal(run.cost_usd), budget=None if cap is None else Decimal(str(cap)))


def risk_for(
    step_id: str, action: str, config: Mapping[str, Any], capability: Capability
) -> tuple[Risk, list[str]]:
    """A step's (or an agent tool call's) risk: the capability's, raised by what the config says."""
    recipients = len(config.get("to") or []) + len(config.get("cc") or []) if action == "send_email" else 0
    verbs = [str(config.get("method", "")), str(config.get("capability", "")), action, step_id]
    return policy.step_risk(
        capability, recipients=recipients, verbs=verbs, network=config.get("network") == "allow"
    )


def redacted(envelope: Envelope, secrets: list[str]) -> Envelope:
    """The envelope with every secret value resolved during the call replaced."""
    if not secrets:
        return envelope
    envelope.data = redact(envelope.data, secrets)
    envelope.summary = redact(envelope.summary, secrets)
    if envelope.error:
        envelope.error = redact(envelope.error, secrets)
    return envelope


def plan_hash(snapshot: dict[str, Any], step_key: str, config: Any) -> str:
    """sha256 of the canonical snapshot + step + rendered config: what an approval is bound to."""
    material = writer.canonical_json({"snapshot": snapshot, "step": step_key, "config": config})
    return hashlib.sha256(material.encode()).hexdigest()


def approval_gate(
    *,
    run: Run,
    step_run: StepRun,
    step: dict,
    config: dict,
    capability: Capability,
    risk: Risk,
    reasons: list[str],
    step_key: str | None = None,
) -> approval_gates.Verdict:
    automation = Automation.objects.filter(pk=run.automation_id).values("version", "updated_by_id").first()
    if automation is None or automation["version"] != run.automation_version:
        return approval_gates.Verdict(
            "invalid", "the automation was edited after this run started; re-run it"
        )
    step_key = step_key or f"{step_run.phase}:{step_run.index}:{step['step_id']}"
    execution = run.snapshot.get("execution") or {}
    verdict = approval_gates.check_step(
        approval_gates.GateRequest(
            workspace_id=run.workspace_id,
            run_id=str(run.pk),
            automation_id=str(run.automation_id),
            automation_name=run.snapshot.get("name", ""),
            step_key=step_key,
            step_id=step["step_id"],
            action=step["action"],
            capability_id=capability.id,
            risk=risk.label,
            reasons=reasons,
            what=config,
            message=str(config.get("message", "")) if step["action"] == "require_approval" else "",
            plan_hash=plan_hash(run.snapshot, step_key, config),
            requested_by=run.triggered_by,
            last_editor_id=automation["updated_by_id"],
            principal_ids=tuple(run.principal_ids or ()),
            extra={"autonomy": execution.get("autonomy", DEFAULT_AUTONOMY)},
            approvals_required=int(step.get("approvals_required", config.get("approvals_required", 1)) or 1),
            expires_in_seconds=int(execution.get("approval_timeout_seconds", 24 * 3600)),
            trace_id=run.trace_id,
        )
    )
    if verdict.created:
        events.publish(
            workspace_id=run.workspace_id, event_type="approval.requested", source="approvals",
            payload={
                "approval_id": verdict.approval_id, "run_id": str(run.pk), "automation_id": str(run.automation_id),
                "automation_name": run.snapshot.get("name", ""), "step_id": step["step_id"], "risk": risk.label,
                "why": verdict.why, "expires_at": verdict.expires_at.isoformat() if verdict.expires_at else None,
            },
            trace_id=run.trace_id, chain_depth=run.chain_depth + 1, parent_run_id=str(run.pk),
        )  # fmt: skip
    return verdict
