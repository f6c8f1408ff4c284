"""Edit-then-approve (issue 30): an approver's whole config for a gated step, checked as a save checks
that step and gated again, before ``approvals.services.approval_decide`` records anything.

What runs afterwards is the edit, exactly: the executor takes the step's edited config
(:func:`edited_step`) instead of rendering the original again, so the gate sees the edit's plan
hash, which the approval and its token are bound to.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from approvals import gate as approval_gates
from approvals import policy, selectors
from approvals.models import Approval
from approvals.services import EditedPlan
from capabilities.base import Envelope, ErrorCode
from capabilities.credentials import credential_grants
from config.errors import InvalidArgument, ServiceError
from workspaces.models import effective_autonomy

from . import definition as defs
from . import gate_policies, gating, steps
from .expressions import template
from .models import Run, StepRun
from .steps import PreparedStep


def _invalid(path: str, code: str, message: str) -> InvalidArgument:
    return InvalidArgument([{"path": path, "code": code, "message": message}], message)


def _step_of(run: Run, approval: Approval) -> tuple[dict[str, Any], StepRun]:
    phase, _, rest = approval.step_key.partition(":")
    index, _, step_id = rest.partition(":")
    plan = steps.steps_of(run, phase) if phase in (steps.PLAN, steps.ON_FAILURE) else []
    step = plan[int(index)] if index.isdigit() and int(index) < len(plan) else None
    # An agent's tool call has a step key "<step>#<call>": its arguments are the agent's, not a config.
    if step is None or step["step_id"] != step_id or step_id != approval.step_id:
        raise _invalid("/edited_config", "not_editable", "only a step's own config can be edited")
    return step, StepRun(run=run, phase=phase, index=int(index), step_id=step_id, action=step["action"])


def check_edit(approval: Approval, edited_config: Any) -> EditedPlan:
    """What ``edited_config`` would run as, or a 400: ``INVALID_ARGUMENT`` when it is not a valid
    config of the step's action (the save's checks: schema, the action's own checks, credentials and
    their grants), ``POLICY_VIOLATION`` when the gate would block it now. Writes nothing that
    outlives a refusal (the caller's transaction rolls back any ``policy.matched`` entry)."""
    if not isinstance(edited_config, dict):
        raise _invalid("/edited_config", "schema_violation", "edited_config must be the step's whole config")
    run = Run.objects.select_related("workspace").filter(pk=approval.run_id).first()
    if run is None:
        raise ServiceError("CONFLICT", "this approval's run no longer exists", 409)
    step, step_run = _step_of(run, approval)
    if step["action"] != approval.action:
        raise _invalid("/edited_config", "not_editable", "only a step's own config can be edited")
    for pointer, _ in template.iter_templates(edited_config):
        raise _invalid("/edited_config" + pointer, "template_not_allowed",
                       "an edited config runs as written: it cannot hold templates")  # fmt: skip
    grants = credential_grants(run.workspace_id)
    issues = defs.step_config_issues(
        {**step, "config": edited_config}, workspace_id=run.workspace_id, credential_names=set(grants),
        credential_grants=grants, automation_id=run.automation_id,
    )  # fmt: skip
    if issues:
        errors = [
            {**issue, "path": "/edited_config" + issue["path"].removeprefix("/config")} for issue in issues
        ]
        raise InvalidArgument(
            errors, f"the edited config is not valid for {approval.action}: {errors[0]['message']}"
        )
    prepared = steps.prepare_config(run, step, edited_config)
    if isinstance(prepared, Envelope):
        error = prepared.error or {}
        code = "POLICY_VIOLATION" if error.get("code") == ErrorCode.POLICY_VIOLATION else "INVALID_ARGUMENT"
        raise ServiceError(code, f"the edited config cannot run: {error.get('message', '')}", 400)
    autonomy = effective_autonomy(
        (run.snapshot.get("execution") or {}).get("autonomy"),
        run.workspace.default_autonomy,
        run.workspace.max_autonomy,
    )
    forced = gate_policies.assess(run, prepared)
    if gating.decision_for(prepared, autonomy, forced.decision) == policy.Decision.BLOCK:
        if forced.decision == policy.Decision.BLOCK:
            why = f"blocked by {'; '.join(forced.reasons)}"
        else:
            why = f"a {prepared.risk.label}-risk step is not allowed at autonomy {autonomy}{gating.explain(prepared)}"
        raise ServiceError("POLICY_VIOLATION", f"the edited config would be refused: {why}", 400)
    # The same request the executor builds for the edited step: same plan hash, quorum, message.
    request = prepared.gate_request(run, step_run, autonomy=autonomy, last_editor_id=approval.last_editor_id,
                                    step_key=approval.step_key, asked_because=forced.reasons)  # fmt: skip
    return EditedPlan(
        config=prepared.config,
        plan_hash=request.plan_hash,
        risk=request.risk,
        reasons=[*request.reasons, *request.asked_because],
        message=request.message,
        why=approval_gates.why_text(request),
        approvals_required=request.approvals_required,
    )


def edited_step(run: Run, step_run: StepRun, prepared: PreparedStep) -> PreparedStep | Envelope:
    """The step as an approver edited it, if one did: their config replaces the rendered one (checked
    again, never rendered), so a re-render cannot escape the edit."""
    step_key = f"{step_run.phase}:{step_run.index}:{prepared.step_id}"
    edited = selectors.edited_config(run.pk, step_key)
    if edited is None:
        return prepared
    edited_step = steps.prepare_config(run, prepared.step, edited)
    return replace(edited_step, edited=True) if isinstance(edited_step, PreparedStep) else edited_step
