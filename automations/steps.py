"""Preparing one step to run (SPEC §7.2): render, validate, describe, assess risk.

:func:`prepare` turns a step of the snapshot into a :class:`PreparedStep` (or
says it is skipped, or why it cannot run), asking the action's definition for
everything action-specific: its capability (or the capability it calls), its
risk inputs, who it notifies, what an approver is told. The approval
:class:`~approvals.gate.GateRequest` for a step is built here too. Nothing in
this module writes to the database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from jsonschema.protocols import Validator

from approvals import policy
from approvals.gate import GateRequest
from audit import writer
from capabilities import json_schema, registry
from capabilities.base import ActionDefinition, Capability, Envelope, ErrorCode, Risk, RiskInputs
from workspaces.models import effective_quorum

from . import definition as defs
from .expressions import template
from .models import Run, StepRun

PLAN, ON_FAILURE = "plan", "on_failure"
DEFAULT_APPROVAL_TIMEOUT_SECONDS = 24 * 3600
DEFAULT_STEP_TIMEOUT = 30.0
QUICK_STEP_SECONDS = 0.1


@dataclass
class PreparedStep:
    step: dict[str, Any]
    action: ActionDefinition
    config: dict[str, Any]  # rendered and valid
    capability: Capability  # what the step exercises (for call_capability: the target)
    risk: Risk
    reasons: list[str]  # which rule raised the risk, and from what to what
    # An approver's edit of the config (edit-then-approve): it runs on that approval, never without it.
    edited: bool = False

    @property
    def step_id(self) -> str:
        return self.step["step_id"]

    def gate_request(
        self,
        run: Run,
        step_run: StepRun,
        *,
        autonomy: str,
        last_editor_id: int | None,
        step_key: str | None = None,
        constraint_subject: Any = None,
        extra: dict[str, Any] | None = None,
        asked_because: tuple[str, ...] = (),
    ) -> GateRequest:
        """What an approver decides on: this exact rendered step (or agent tool call) of this run."""
        step_key = step_key or f"{step_run.phase}:{step_run.index}:{self.step_id}"
        execution = run.snapshot.get("execution") or {}
        return GateRequest(
            workspace_id=run.workspace_id,
            run_id=str(run.pk),
            automation_id=str(run.automation_id),
            automation_name=run.snapshot.get("name", ""),
            step_key=step_key,
            step_id=self.step_id,
            action=self.action.name,
            capability_id=self.capability.id,
            risk=self.risk.label,
            reasons=self.reasons,
            what=self.config,
            message=self.action.approver_message(self.config),
            plan_hash=plan_hash(run.snapshot, step_key, self.config),
            requested_by=run.triggered_by,
            last_editor_id=last_editor_id,
            principal_ids=tuple(run.principal_ids or ()),
            always_asks_human=self.action.always_asks_human,
            asked_because=asked_because,
            extra={"autonomy": autonomy, **(extra or {})},
            automation_version=run.automation_version,
            constraint_subject=constraint_subject,
            # Never fewer than the workspace's min_approvals, read now (issue 29).
            approvals_required=effective_quorum(
                self.step.get("approvals_required", self.config.get("approvals_required", 1)),
                run.workspace.min_approvals,
            ),
            # A human checkpoint's own timeout (ask_human's timeout_seconds) wins over the run's.
            expires_in_seconds=int(
                (self.action.always_asks_human and self.config.get("timeout_seconds"))
                or execution.get("approval_timeout_seconds", DEFAULT_APPROVAL_TIMEOUT_SECONDS)
            ),
            trace_id=run.trace_id,
        )


class Skip:
    """The step's ``when`` was false."""


SKIP = Skip()


def steps_of(run: Run, phase: str) -> list[dict[str, Any]]:
    if phase == PLAN:
        return run.snapshot["plan"]
    return (run.snapshot.get("execution") or {}).get("on_failure") or []


def is_quick(step: dict[str, Any], workspace_id: int) -> bool:
    """A step without side effects that finishes in milliseconds: safe to repeat after a crash."""
    action = defs.action_of(step)
    if action is None or action.always_asks_human or action.target is not None:
        return False
    capability = defs.describe_step(step, workspace_id)
    return (
        capability is not None
        and not capability.has_side_effects
        and capability.expected_duration_seconds <= QUICK_STEP_SECONDS
    )


def step_timeout(step: dict[str, Any], expected: float, deadline: datetime) -> float:
    """Seconds the step's handler gets: its own timeout, never past the run's deadline."""
    declared = float(step.get("timeout_seconds", max(expected, DEFAULT_STEP_TIMEOUT)))
    return max(0.1, min(declared, (deadline - timezone.now()).total_seconds()))


def step_context(run: Run, attempt: int) -> dict[str, Any]:
    """What a step's templates see: inputs, trigger, earlier outputs, the run."""
    run_info: dict[str, Any] = {
        "id": str(run.pk),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "automation_id": str(run.automation_id),
        "automation_name": run.snapshot.get("name"),
        "automation_version": run.automation_version,
        "trigger_type": run.trigger_type,
        "trigger_key": run.trigger_key,
        "attempt": attempt,
    }
    if run.phase == ON_FAILURE and run.error:
        run_info["error"] = {k: run.error.get(k) for k in ("code", "message")}
        run_info["failed_step_id"] = run.error.get("step_id")
    context = {**run.context, "inputs": run.inputs, "trigger": run.trigger_payload, "run": run_info}
    context["event"] = run.trigger_payload if run.trigger_type == "event" else {}
    return context


def _failure(code: str, message: str) -> Envelope:
    return Envelope.failure(code, message, retryable=False)


def prepare(run: Run, step: dict[str, Any], attempt: int) -> PreparedStep | Skip | Envelope:
    """Render and check ``step``; an :class:`Envelope` (a failure) says why it cannot run."""
    context = step_context(run, attempt)
    try:
        if "when" in step and not template.evaluate_predicate(step["when"], context):
            return SKIP
        config = template.render_value(step.get("config") or {}, context)
    except template.TemplateError as exc:
        return _failure(exc.code, exc.message)
    return prepare_config(run, step, config)


def prepare_config(run: Run, step: dict[str, Any], config: Any) -> PreparedStep | Envelope:
    """Check and describe a step's concrete ``config``: the rendered one, or an approver's edit of it
    (edit-then-approve), which runs as it is, never rendered."""
    action = registry.get_action(step["action"])
    if action is None:
        return _failure(ErrorCode.CAPABILITY_NOT_FOUND, f"unknown action '{step['action']}'")
    problem = first_error(action.name, action.config_schema, config)
    if problem is not None:
        return _failure(ErrorCode.INVALID_ARGUMENT, f"config invalid after rendering at /{problem}")
    capability = defs.describe_step({**step, "config": config}, run.workspace_id)
    if action.target is not None:
        if capability is None or capability.handler is None:
            held = registry.held_reason(config.get("capability"), run.workspace_id)
            if held is not None:  # it exists, but policy holds it back (e.g. a rug-pulled MCP tool)
                return _failure(ErrorCode.POLICY_VIOLATION, held)
            return _failure(
                ErrorCode.CAPABILITY_NOT_FOUND, f"unknown capability '{config.get('capability')}'"
            )
        args = action.target_args(config) if action.target_args else config
        problem = first_error(f"capability:{capability.id}", capability.input_schema, args, cache=False)
        if problem is not None:
            return _failure(
                ErrorCode.INVALID_ARGUMENT, f"args do not match {capability.id}'s input schema at /{problem}"
            )
    if capability is None:
        return _failure(ErrorCode.CAPABILITY_NOT_FOUND, f"unknown capability '{step['action']}'")
    risk, reasons = risk_for(action, config, capability)
    return PreparedStep(
        step=step, action=action, config=config, capability=capability, risk=risk, reasons=reasons
    )


REUSED_FROM = "reused_from_run"  # the checkpoint of a step row a re-run copied from the run it repeats


def reused_from(step_run: StepRun) -> str | None:
    """The run a re-run copied this step row from (its outcome is reused, never executed again)."""
    checkpoint = step_run.checkpoint
    return checkpoint.get(REUSED_FROM) if isinstance(checkpoint, dict) else None


def prepare_reused(run: Run, step: dict[str, Any], config: Any) -> PreparedStep | Envelope:
    """A step a re-run reuses, described from the config it ran with (not rendered again): what the
    gate needs to ask again when the step would be gated now (issue 29)."""
    action = registry.get_action(step["action"])
    if action is None:
        return _failure(ErrorCode.CAPABILITY_NOT_FOUND, f"unknown action '{step['action']}'")
    config = config if isinstance(config, dict) else {}
    capability = defs.describe_step({**step, "config": config}, run.workspace_id)
    if capability is None:
        return _failure(ErrorCode.CAPABILITY_NOT_FOUND, f"unknown capability for step '{step['step_id']}'")
    risk, reasons = risk_for(action, config, capability)
    return PreparedStep(
        step=step, action=action, config=config, capability=capability, risk=risk, reasons=reasons
    )


def risk_for(
    action: ActionDefinition | None, config: Mapping[str, Any], capability: Capability
) -> tuple[Risk, list[str]]:
    """A step's (or an agent tool call's) risk: the capability's, raised by what the action reads in the
    config (method, recipients, network grant). The step's id is a label and plays no part."""
    inputs = action.risk_inputs(config) if action is not None else RiskInputs()
    recipients = len(action.notifies(config)) if action is not None else 0
    return policy.step_risk(capability, inputs, recipients=recipients)


_validators: dict[str, Validator] = {}


def first_error(name: str, schema: Any, instance: Any, *, cache: bool = True) -> str | None:
    """The JSON pointer (without its leading slash) of the first schema error, if any."""
    validator = _validators.get(name) if cache else None
    if validator is None:
        validator = json_schema.validator(schema)
        if cache:
            _validators[name] = validator
    errors = sorted(validator.iter_errors(instance), key=str)
    return "/".join(map(str, errors[0].absolute_path)) if errors else None


def plan_hash(snapshot: dict[str, Any], step_key: str, config: Any) -> str:
    """sha256 of the canonical snapshot + step + rendered config: what an approval is bound to."""
    material = writer.canonical_json({"snapshot": snapshot, "step": step_key, "config": config})
    return hashlib.sha256(material.encode()).hexdigest()


# Answers that say the request was not processed (or not yet): a retry is the same call.
NOT_PROCESSED_STATUSES = frozenset({408, 425, 429, 502, 503, 504})


def definite_failure(envelope: Envelope) -> bool:
    """Did the receiver answer this call with a failure it processed (a 500, a 4xx)?

    Then a retry is a new call with a new ``Idempotency-Key``: a receiver that stores
    responses per key (Stripe stores and replays a 500) would otherwise answer the
    retry with the stored failure. Anything else (no answer: worker lost, timeout,
    connection dropped; or 408/425/429/502/503/504, "not processed") keeps the key.
    """
    status = envelope.data.get("status") if isinstance(envelope.data, dict) else None
    return (
        not envelope.ok and isinstance(status, int) and status >= 400 and status not in NOT_PROCESSED_STATUSES
    )


def idempotency_key(run_id: str, step_id: str, attempt: int, config: Any) -> str:
    material = f"{run_id}\x00{step_id}\x00{attempt}\x00{writer.canonical_json(config)}"
    return hashlib.sha256(material.encode()).hexdigest()
