"""Tool calls of an ``agent_task`` step: the path a step calling that capability takes.

Each call the model makes is, in order: checked against the step's ``tools``
allowlist (a miss is told to the model, nothing runs); looked up; its
arguments validated against the tool's ``input_schema`` (a mismatch is told
to the model, nothing runs); described for risk and put through the gate
matrix at the run's autonomy — ``block`` fails the step with
``POLICY_VIOLATION``, ``preview`` returns a dry run, ``confirm`` asks the
approval gate under its own step key (``<phase>:<index>:<step_id>#t<n>``) and
the plan hash of exactly ``{"tool", "args"}`` (a standing approval's ``arg_constraint``
is matched against the tool's own arguments): pending parks the run
(``AwaitingApproval``), denied or expired fail the step. A URL the model chose
(``core.http_get``, ``http_request``) that reaches a non-public address always
asks a human (``confirm`` even where the matrix says ``allow``, no standing
approval covers it, reason "agent-chosen URL to a non-public address"), whichever
allowlist admits it; a fetch that did not ask reaches public addresses only,
redirect hops included. Then the handler
runs, its output redacted like any step's, its cost charged to the step's
meter. Every call writes one ``agent.tool`` audit row (plus the gate's own
rows when it asked for approval).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from approvals import policy
from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from capabilities import egress, json_schema, registry, tools
from capabilities.base import (
    ActionContext,
    AwaitingApproval,
    Capability,
    Envelope,
    ErrorCode,
    Risk,
    SideEffect,
    StepFailure,
)

from . import gate_policies, gating, steps
from .models import Run, StepRun
from .outcomes import redacted

logger = logging.getLogger(__name__)

_ENDED = {"denied": ErrorCode.APPROVAL_DENIED, "expired": ErrorCode.APPROVAL_EXPIRED}


@dataclass
class ToolGateway:
    run: Run
    step_run: StepRun
    step: Mapping[str, Any]
    config: Mapping[str, Any]
    autonomy: str
    ctx: ActionContext | None = None

    def __call__(self, tool_id: str, args: Mapping[str, Any], call_key: str) -> Envelope:
        assert self.ctx is not None
        refused = self._refusal(tool_id, args)
        if refused is not None:
            self._audit(tool_id, call_key, args, refused, decision="refused")
            return refused
        tool = tools.tool(tool_id, self.run.workspace_id)
        assert tool is not None  # _refusal looked it up
        capability = _describe(tool, args)
        risk, reasons = steps.risk_for(registry.get_action(tool_id), args, capability)
        # The workspace's policies see the tool's own arguments, as they see a step's config.
        forced = gate_policies.evaluate(self.run, self.step["step_id"], dict(args), risk, subject=tool_id,
                                        capability_id=capability.id)  # fmt: skip
        decision = policy.Decision.PREVIEW if self.autonomy == "A0" else policy.gate(self.autonomy, risk)
        if forced.decision == policy.Decision.BLOCK:
            decision = policy.Decision.BLOCK
        elif forced.decision == policy.Decision.CONFIRM and decision == policy.Decision.ALLOW:
            decision = policy.Decision.CONFIRM
        # An agent-chosen URL to a non-public address waits for a human, whichever allowlist admits it.
        non_public = _fetches_non_public(tool_id, args)
        if non_public and decision == policy.Decision.ALLOW:
            decision = policy.Decision.CONFIRM
        if non_public:
            reasons = [*reasons, NON_PUBLIC_REASON]
        if decision == policy.Decision.BLOCK:
            why = "; ".join(forced.reasons) if forced.decision == policy.Decision.BLOCK else (
                f"{risk.label} risk is not allowed at autonomy {self.autonomy}")  # fmt: skip
            failure = StepFailure(ErrorCode.POLICY_VIOLATION, f"tool {tool_id}: {why}")
            self._audit(tool_id, call_key, args, Envelope.failure(failure.code, failure.message), decision="block",
                        risk=risk)  # fmt: skip
            raise failure
        if decision == policy.Decision.PREVIEW:
            preview = Envelope.success({"preview": True, "tool": tool_id, "args": dict(args), "risk": risk.label},
                                       summary=f"dry run at autonomy {self.autonomy}: not executed")  # fmt: skip
            self._audit(tool_id, call_key, args, preview, decision="preview", risk=risk)
            return preview
        if decision == policy.Decision.CONFIRM:
            self._approved_or_park(
                tool_id, args, call_key, capability, risk, reasons, forced.reasons, human=non_public
            )
        envelope = self._execute(tool, capability, args, public_only=not non_public)
        self._audit(tool_id, call_key, args, envelope, decision=str(decision), risk=risk)
        if envelope.cost_usd:
            self.ctx.cost_meter.charge(envelope.cost_usd, f"tool {tool_id}")
        return envelope

    def _refusal(self, tool_id: str, args: Mapping[str, Any]) -> Envelope | None:
        if not tools.allowed(tool_id, self.config.get("tools") or []):
            return Envelope.failure(ErrorCode.POLICY_VIOLATION,
                                    f"'{tool_id[:100]}' is not in this step's tools allowlist", retryable=False)  # fmt: skip
        tool = tools.tool(tool_id, self.run.workspace_id)
        if tool is None:
            held = registry.held_reason(tool_id, self.run.workspace_id)
            if held is not None:
                return Envelope.failure(ErrorCode.POLICY_VIOLATION, held[:300], retryable=False)
            return Envelope.failure(
                ErrorCode.CAPABILITY_NOT_FOUND, f"unknown tool '{tool_id[:100]}'", retryable=False
            )
        bad = next(json_schema.validator(tool.input_schema).iter_errors(dict(args)), None)
        if bad is not None:
            where = "/".join(map(str, bad.absolute_path))
            return Envelope.failure(ErrorCode.INVALID_ARGUMENT,
                                    f"arguments do not match {tool_id}'s input schema at /{where}: {bad.message[:200]}",
                                    retryable=False)  # fmt: skip
        return None

    def _approved_or_park(self, tool_id: str, args: Mapping[str, Any], call_key: str, capability: Capability,
                          risk: Risk, reasons: list[str], asked_because: tuple[str, ...] = (),
                          human: bool = False) -> None:  # fmt: skip
        step_key = f"{self.step_run.phase}:{self.step_run.index}:{self.step['step_id']}#{call_key}"
        action = registry.get_action(self.step["action"])
        assert action is not None  # the step is running, so its action was found when it was prepared
        if human:  # no standing approval covers it: a person looks at this URL
            action = dataclasses.replace(action, always_asks_human=True)
        prepared = steps.PreparedStep(
            step=dict(self.step), action=action,
            config={"tool": tool_id, "args": dict(args)}, capability=capability, risk=risk, reasons=reasons,
        )  # fmt: skip
        # A standing approval's arg_constraint reads the tool's own arguments (issue 29), as it reads a
        # step's flat config: never {"tool", "args"}, where a constraint on the arguments' fields is vacuous.
        verdict = gating.approval_verdict(self.run, self.step_run, prepared, self.autonomy, step_key=step_key,
                                          constraint_subject=dict(args), asked_because=asked_because)  # fmt: skip
        if verdict.status == "approved":
            return
        if verdict.status == "pending":
            raise AwaitingApproval(verdict.approval_id)
        raise StepFailure(verdict.code or _ENDED.get(verdict.status, ErrorCode.POLICY_VIOLATION),
                          f"tool {tool_id}: {verdict.message}", retryable=False)  # fmt: skip

    def _execute(self, tool: tools.Tool, capability: Capability, args: Mapping[str, Any],
                 public_only: bool = False) -> Envelope:  # fmt: skip
        assert self.ctx is not None
        if SideEffect.COST_INCURRING in capability.side_effects:
            self.ctx.cost_meter.check()
        # A fetch nobody approved reaches public addresses only, its redirects included.
        ctx = (
            dataclasses.replace(self.ctx, public_egress_only=True)
            if public_only and tool.id in URL_TOOLS
            else self.ctx
        )
        try:
            envelope = tool.handler(ctx, dict(args))
        except StepFailure as exc:
            envelope = Envelope.failure(exc.code, exc.message, retryable=exc.retryable)
        except (AwaitingApproval, KeyboardInterrupt):
            raise
        except Exception:
            logger.exception("run %s: tool %s raised", self.run.pk, tool.id)
            envelope = Envelope.failure(
                ErrorCode.INTERNAL, "the tool failed with an internal error", retryable=False
            )
        return redacted(envelope, self.ctx.secrets)

    def _audit(self, tool_id: str, call_key: str, args: Mapping[str, Any], envelope: Envelope, *, decision: str,
               risk: Risk | None = None) -> None:  # fmt: skip
        assert self.ctx is not None
        step_id = self.step["step_id"]
        error = envelope.error or {}
        writer.append(
            trace_id=self.run.trace_id, type="agent.tool", workspace_id=self.run.workspace_id, stage="execute",
            summary=f"{step_id}: tool {tool_id[:100]} " + ("ok" if envelope.ok else f"refused/failed: {error.get('code')}"),
            outcome=Outcome.SUCCESS if envelope.ok else Outcome.FAILURE,
            refs={"run": str(self.run.pk), "automation": str(self.run.automation_id), "step": step_id},
            actor=f"agent:{self.run.pk}:{step_id}",
            payload={"tool": tool_id[:200], "call": call_key, "decision": decision,
                     "risk": risk.label if risk is not None else None, "args": redact(dict(args), self.ctx.secrets),
                     "error": error or None},
            secrets=self.ctx.secrets,
        )  # fmt: skip


# Tools that fetch the URL the model puts in ``args["url"]``.
URL_TOOLS = frozenset({"core.http_get", "http_request"})
NON_PUBLIC_REASON = "agent-chosen URL to a non-public address"


def _fetches_non_public(tool_id: str, args: Mapping[str, Any]) -> bool:
    url = args.get("url")
    return tool_id in URL_TOOLS and isinstance(url, str) and egress.reaches_non_public(url)


def _describe(tool: tools.Tool, args: Mapping[str, Any]) -> Capability:
    try:
        return tool.describe(args)
    except Exception:  # assume the worst about a description that cannot be computed
        return Capability(id=tool.id, risk=Risk.HIGH, idempotent=False,
                          side_effects=frozenset({SideEffect.EXTERNAL_WRITE}))  # fmt: skip
