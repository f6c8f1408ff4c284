"""The gate in front of a prepared step (SPEC §7.3): risk × autonomy → one outcome.

:func:`gate` answers with a :class:`GateResult` whose ``outcome`` is one of

* ``PROCEED`` — run the step now (allowed, or approved by a human or a standing approval);
* ``PREVIEW`` — autonomy A0: record a dry run instead of calling the handler;
* ``PARK``    — an approval is pending: the run waits for a decision;
* ``REFUSE``  — blocked at this autonomy, denied, expired or invalid: ``envelope``
  is the step's failure, and its message says which rule raised the risk; or a step
  allowed to run whose estimated cost would exceed the run's budget cap.

A step whose action always asks a human (``require_approval``) is confirmed
whatever the autonomy allows, except at A0 where everything is a preview.

The workspace's policies (argument rules, credentials that always ask, quiet hours:
``gate_policies``) can only tighten that: their ``block`` refuses the step even at A0,
their ``ask`` confirms a step the matrix would allow.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from approvals import gate as approval_gates
from approvals import policy
from capabilities.base import Envelope, ErrorCode
from notifications import services as notices

from . import events, gate_policies
from .models import Automation, Run, StepRun
from .steps import PreparedStep


class GateOutcome(enum.Enum):
    PROCEED = "proceed"
    PREVIEW = "preview"
    PARK = "park"
    REFUSE = "refuse"


@dataclass(frozen=True)
class GateResult:
    outcome: GateOutcome
    envelope: Envelope | None = None  # REFUSE: the step's failure
    blocked: bool = False  # REFUSE by the gate matrix itself (audited as gate.blocked)


PROCEED = GateResult(GateOutcome.PROCEED)


def _refuse(code: str, message: str, *, blocked: bool = False) -> GateResult:
    return GateResult(GateOutcome.REFUSE, Envelope.failure(code, message, retryable=False), blocked=blocked)


def explain(prepared: PreparedStep) -> str:
    return f" ({'; '.join(prepared.reasons)})" if prepared.reasons else ""


def decision_for(
    prepared: PreparedStep, autonomy: str, forced: policy.Decision | None = None
) -> policy.Decision:
    """``forced``: what the workspace's policies say (BLOCK or CONFIRM); it never loosens the matrix."""
    if forced == policy.Decision.BLOCK:
        return forced
    if autonomy == "A0":
        return policy.Decision.PREVIEW
    if prepared.action.always_asks_human or prepared.edited:  # an edit runs on its approval's token
        return policy.Decision.CONFIRM
    decision = policy.gate(autonomy, prepared.risk)
    return (
        policy.Decision.CONFIRM
        if forced == policy.Decision.CONFIRM and decision == policy.Decision.ALLOW
        else decision
    )


def gate(run: Run, step_run: StepRun, prepared: PreparedStep, autonomy: str) -> GateResult:
    result = _gate(run, step_run, prepared, autonomy)
    if result.outcome == GateOutcome.PROCEED and _over_budget(run, prepared):
        return _refuse(ErrorCode.BUDGET_EXCEEDED, "the run's budget cap would be exceeded")
    return result


def _over_budget(run: Run, prepared: PreparedStep) -> bool:
    cap = (run.snapshot.get("execution") or {}).get("budget_cap_usd")
    if cap is None:
        return False
    return Decimal(run.cost_usd) + prepared.capability.estimate_cost(prepared.config) > Decimal(str(cap))


def _gate(run: Run, step_run: StepRun, prepared: PreparedStep, autonomy: str) -> GateResult:
    forced = gate_policies.assess(run, prepared)
    decision = decision_for(prepared, autonomy, forced.decision)
    if decision == policy.Decision.ALLOW:
        return PROCEED
    if decision == policy.Decision.PREVIEW:
        return GateResult(GateOutcome.PREVIEW)
    if decision == policy.Decision.BLOCK:
        message = (
            f"a {prepared.risk.label}-risk step is not allowed at autonomy {autonomy}{explain(prepared)}"
        )
        if forced.decision == policy.Decision.BLOCK:
            message = f"blocked by {'; '.join(forced.reasons)}"
        return _refuse(ErrorCode.POLICY_VIOLATION, message, blocked=True)
    # An approver's edit runs on their approval: no standing approval stands in for it.
    asked_because = (*forced.reasons, "an approver's edit") if prepared.edited else forced.reasons
    verdict = approval_verdict(run, step_run, prepared, autonomy, asked_because=asked_because)
    if verdict.status == "approved":
        return PROCEED
    if verdict.status == "pending":
        return GateResult(GateOutcome.PARK)
    code = verdict.code or {"denied": ErrorCode.APPROVAL_DENIED, "expired": ErrorCode.APPROVAL_EXPIRED}.get(
        verdict.status, ErrorCode.POLICY_VIOLATION
    )
    return _refuse(code, verdict.message)


def approval_verdict(
    run: Run,
    step_run: StepRun,
    prepared: PreparedStep,
    autonomy: str,
    step_key: str | None = None,
    constraint_subject: Any = None,
    extra: dict[str, Any] | None = None,
    asked_because: tuple[str, ...] = (),
) -> approval_gates.Verdict:
    """The approval gate for a step (or an agent tool call) that needs a human: standing approval, or an Approval.

    ``constraint_subject``: what a standing approval's ``arg_constraint`` is matched against when it
    is not the rendered config (an agent tool call's own arguments)."""
    automation = Automation.objects.filter(pk=run.automation_id).values("version", "updated_by_id").first()
    if automation is None or automation["version"] != run.automation_version:
        return approval_gates.Verdict(
            "invalid", "the automation was edited after this run started; re-run it"
        )
    request = prepared.gate_request(
        run, step_run, autonomy=autonomy, last_editor_id=automation["updated_by_id"], step_key=step_key,
        constraint_subject=constraint_subject, extra=extra, asked_because=asked_because,
    )  # fmt: skip
    verdict = approval_gates.check_step(request)
    if verdict.status == "expired":  # on_expiry: re_request asks again, bound to the plan as rendered now
        verdict = notices.re_request(request, prepared.step, run.snapshot.get("execution")) or verdict
    if verdict.created:
        events.publish(
            workspace_id=run.workspace_id, event_type="approval.requested", source="approvals",
            payload={
                "approval_id": verdict.approval_id, "run_id": str(run.pk), "automation_id": str(run.automation_id),
                "automation_name": request.automation_name, "step_id": prepared.step_id, "risk": request.risk,
                "why": verdict.why, "expires_at": verdict.expires_at.isoformat() if verdict.expires_at else None,
            },
            trace_id=run.trace_id, chain_depth=run.chain_depth + 1, parent_run_id=str(run.pk),
        )  # fmt: skip
        notices.approval_requested(
            approval_id=verdict.approval_id, step=prepared.step, execution=run.snapshot.get("execution")
        )
    return verdict
