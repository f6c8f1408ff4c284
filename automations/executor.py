"""The step loop (SPEC §7.2): a loop with bookkeeping, not an agent. No Celery here.

Crash safety rests on three rules:

* **Claim.** A worker owns a run only after a conditional UPDATE moved it to
  ``running`` with its id and a lease; every later write is fenced on that
  claim, so a redelivered message or a second worker changes nothing.
* **Checkpoint before side effects.** A step with side effects is recorded as
  ``running`` (with its idempotency key) and committed *before* its handler is
  called; its outcome is committed after. Steps without side effects write
  both at once, after the call.
* **Recovery.** A claim that finds the current step ``running`` with no outcome
  knows the previous worker died mid-call: a step safe to retry gets a new
  attempt; any other becomes ``OUTCOME_UNKNOWN`` and the run
  ``needs_attention`` for an operator — never a guessed success.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import random
import socket
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone
from jsonschema import Draft202012Validator

from approvals import policy
from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from capabilities import registry
from capabilities.base import AwaitingApproval, Capability, CostMeter, Envelope, ErrorCode, StepFailure

from . import definition as defs
from . import events, runtime
from .agent_tools import ToolGateway
from .concurrency import run_settled
from .enqueue import run_wake_at
from .expressions import template
from .lease import LeaseKeeper
from .models import FINAL_RUN_STATUSES, Run, RunStatus, StepRun, StepStatus
from .transitions import check_transition

logger = logging.getLogger(__name__)

DEFAULT_STEP_TIMEOUT = 30.0
DEFAULT_RUN_TIMEOUT = 3600.0
QUICK_STEP_SECONDS = 0.1
MAX_BACKOFF_SECONDS = 300.0
PLAN, ON_FAILURE = "plan", "on_failure"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class LostClaim(Exception):
    """Another worker owns this run now; stop without writing anything."""


@dataclass
class Parked:
    """The run left the worker: waiting for a retry, a timer or an approval."""

    status: str
    wake_at: datetime | None = None


# --- claiming ----------------------------------------------------------------


def _claimant_is_dead(claimed_by: str) -> bool:
    host, _, pid = claimed_by.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        # A killed process stays a zombie until its parent reaps it; that is dead too.
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]  # noqa: SIM115
    except OSError:
        return True
    return state in ("Z", "X")


def claim(run_id: str, me: str) -> Run | None:
    now = timezone.now()
    lease = now + timedelta(seconds=settings.AUTOPLANE_RUN_LEASE_SECONDS)
    claimable = (
        Q(status=RunStatus.QUEUED, enqueued_at__isnull=False)
        | Q(status=RunStatus.WAITING, wake_at__lte=now)
        | Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    )
    taken = Run.objects.filter(claimable, pk=run_id).update(
        status=RunStatus.RUNNING, claimed_by=me, lease_expires_at=lease, wake_at=None,
        started_at=Coalesce(F("started_at"), Value(now)),
    )  # fmt: skip
    if not taken:
        # A worker on this host that died (kill -9, OOM) leaves its lease behind;
        # take over at once instead of waiting for the lease to run out.
        row = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).values("claimed_by").first()
        if row and row["claimed_by"] and row["claimed_by"] != me and _claimant_is_dead(row["claimed_by"]):
            taken = Run.objects.filter(
                pk=run_id, status=RunStatus.RUNNING, claimed_by=row["claimed_by"]
            ).update(claimed_by=me, lease_expires_at=lease)
    if not taken:
        return None
    run = Run.objects.select_related("workspace").get(pk=run_id)
    run.first_claim = run.started_at == now  # the Coalesce above kept an earlier start
    return run


class Executor:
    def __init__(self, run: Run, me: str):
        self.run = run
        self.me = me
        self.step_runs = {(s.phase, s.index): s for s in StepRun.objects.filter(run=run)}
        self.snapshot = run.snapshot
        self.execution = self.snapshot.get("execution") or {}
        self.autonomy = self.execution.get("autonomy", defs.DEFAULT_AUTONOMY)
        timeout = float(self.execution.get("timeout_seconds", DEFAULT_RUN_TIMEOUT))
        self.deadline = run.started_at + timedelta(seconds=timeout)
        # The claim just read the row: the first step needs no fresh look at the cancel flag.
        self.fresh = True
        self.batching = False

    # --- fenced writes ---------------------------------------------------------

    def _update_run(self, **fields: Any) -> None:
        """Write run fields only while this worker still holds the claim."""
        if "status" in fields:
            check_transition(self.run.status, fields["status"])
        updated = Run.objects.filter(pk=self.run.pk, claimed_by=self.me, status=self.run.status).update(
            **fields
        )
        if not updated:
            raise LostClaim(str(self.run.pk))
        for name, value in fields.items():
            if not hasattr(value, "resolve_expression"):
                setattr(self.run, name, value)

    def _audit(self, type: str, summary: str, outcome: str = Outcome.INFO, **extra: Any) -> None:
        writer.append(
            trace_id=self.run.trace_id,
            type=type,
            summary=summary,
            outcome=outcome,
            workspace_id=self.run.workspace_id,
            stage=extra.pop("stage", "execute"),
            refs={
                "run": str(self.run.pk),
                "automation": str(self.run.automation_id),
                **extra.pop("refs", {}),
            },
            actor=extra.pop("actor", f"worker:{self.me}"),
            payload=extra.pop("payload", {}),
            secrets=extra.pop("secrets", ()),
        )

    # --- the loop ------------------------------------------------------------

    def execute(self) -> None:
        try:
            if not self._recover():
                return
            # Committed on its own: a batch below may roll back, the start must not.
            self._start()
            while True:
                if self._quick_step_next():
                    # Steps without side effects that finish in milliseconds are safe to
                    # repeat after a crash, so a run of them (and the run's end) share one
                    # transaction instead of committing step by step.
                    with transaction.atomic():
                        self.batching = True
                        done = self._advance_while(self._quick_step_next)
                    self.batching = False
                else:
                    done = self._advance_while(lambda: True, limit=1)
                if done:
                    return
        except LostClaim:
            logger.info("run %s: claim lost to another worker; stopping", self.run.pk)

    def _advance_while(self, condition, limit: int | None = None) -> bool:
        """Run steps while ``condition()`` holds; True once the run left this worker."""
        count = 0
        while limit is None or count < limit:
            if self._stop_requested():
                return True
            steps = self._steps(self.run.phase)
            if self.run.step_index >= len(steps):
                self._finish_phase()
                return True
            if count and not condition():
                return False
            if isinstance(self._run_step(steps[self.run.step_index]), Parked):
                return True
            count += 1
        return False

    def _quick_step_next(self) -> bool:
        steps = self._steps(self.run.phase)
        if self.run.step_index >= len(steps):
            return True  # finishing is quick too
        step = steps[self.run.step_index]
        if step["action"] in ("require_approval", "call_capability"):
            return False
        capability = defs.describe_step(step, self.run.workspace_id)
        return (
            capability is not None
            and not capability.has_side_effects
            and capability.expected_duration_seconds <= QUICK_STEP_SECONDS
        )

    def _steps(self, phase: str) -> list[dict[str, Any]]:
        if phase == PLAN:
            return self.snapshot["plan"]
        return self.execution.get("on_failure") or []

    def _start(self) -> None:
        if not getattr(self.run, "first_claim", False):
            return
        self.run.first_claim = False
        queued_ms = (self.run.started_at - self.run.created_at).total_seconds() * 1000
        self._audit("run.started", f"run started on {self.run.queue}", payload={"queue_wait_ms": queued_ms})

    def _recover(self) -> bool:
        """Decide what to do with a step a dead worker left ``running``. False = stop."""
        step_run = self.step_runs.get((self.run.phase, self.run.step_index))
        if step_run is None or step_run.status != StepStatus.RUNNING:
            return True
        step = self._steps(self.run.phase)[self.run.step_index]
        capability = self._describe(step, step_run.rendered_config or step.get("config") or {})
        if capability is not None and capability.safe_to_retry:
            with transaction.atomic(savepoint=False):
                self._save_step(step_run, status=StepStatus.PENDING)
                self._audit("step.recovered", f"{step['step_id']}: worker lost mid-step; safe to retry",
                            refs={"step": step["step_id"]}, payload={"attempt": step_run.attempt})  # fmt: skip
            return True
        message = "the worker stopped during this step; whether its side effect happened is unknown"
        with transaction.atomic(savepoint=False):
            self._save_step(
                    step_run,
                status=StepStatus.FAILED, error_code=ErrorCode.OUTCOME_UNKNOWN, error_message=message,
                finished_at=timezone.now(),
                output=Envelope.failure(ErrorCode.OUTCOME_UNKNOWN, message, retryable=False).as_dict(),
            )  # fmt: skip
            error = {"code": ErrorCode.OUTCOME_UNKNOWN, "message": message, "step_id": step["step_id"]}
            self._update_run(
                status=RunStatus.NEEDS_ATTENTION, error=error, claimed_by="", lease_expires_at=None
            )
            self._audit("step.outcome_unknown", f"{step['step_id']}: {message}", Outcome.FAILURE,
                        refs={"step": step["step_id"]}, payload={"idempotency_key": step_run.idempotency_key})  # fmt: skip
            self._audit(
                "run.needs_attention", "run needs an operator to resolve an unknown outcome", Outcome.FAILURE
            )
        run_settled(self.run)
        return False

    def _stop_requested(self) -> bool:
        if self.fresh:
            self.fresh = False
            cancel = self.run.cancel_requested
        else:
            cancel = Run.objects.filter(pk=self.run.pk, cancel_requested=True).exists()
        if cancel:
            self._finish(
                RunStatus.CANCELLED,
                error={"code": ErrorCode.CANCELLED, "message": "cancelled by an operator"},
            )
            return True
        if timezone.now() > self.deadline and self.run.phase == PLAN:
            self._fail(
                {"code": ErrorCode.TIMEOUT, "message": "the run exceeded its timeout"}, RunStatus.TIMED_OUT
            )
            return self.run.status in FINAL_RUN_STATUSES
        return False

    # --- one step ------------------------------------------------------------

    def _context(self, attempt: int) -> dict[str, Any]:
        run = self.run
        run_info: dict[str, Any] = {
            "id": str(run.pk),
            "started_at": run.started_at.isoformat() if run.started_at else None,
            "automation_id": str(run.automation_id),
            "automation_name": self.snapshot.get("name"),
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

    def _describe(self, step: dict[str, Any], config: dict[str, Any]) -> Capability | None:
        return defs.describe_step({**step, "config": config}, self.run.workspace_id)

    def _step_run(self, step: dict[str, Any]) -> StepRun:
        """This step's row; unsaved until the step is checkpointed or has an outcome."""
        key = (self.run.phase, self.run.step_index)
        if key not in self.step_runs:
            self.step_runs[key] = StepRun(run=self.run, phase=key[0], index=key[1], step_id=step["step_id"],
                                          action=step["action"])  # fmt: skip
        return self.step_runs[key]

    def _save_step(self, step_run: StepRun, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(step_run, name, value)
        if step_run.pk is None:
            step_run.save(force_insert=True)
        else:
            StepRun.objects.filter(pk=step_run.pk).update(**fields)

    def _run_step(self, step: dict[str, Any]) -> Parked | None:
        step_run = self._step_run(step)
        if step_run.status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):  # reused by a re-run
            self._advance()
            return None
        attempt = step_run.attempt + 1
        context = self._context(attempt)
        try:
            if "when" in step and not template.evaluate_predicate(step["when"], context):
                self._skip(step_run, step)
                return None
            config = template.render_value(step.get("config") or {}, context)
        except template.TemplateError as exc:
            return self._step_failed(
                step_run, step, attempt, Envelope.failure(exc.code, exc.message, retryable=False)
            )
        action = registry.get_action(step["action"])
        if action is None:
            return self._step_failed(step_run, step, attempt, Envelope.failure(
                ErrorCode.CAPABILITY_NOT_FOUND, f"unknown action '{step['action']}'", retryable=False))  # fmt: skip
        problems = sorted(_validator(step["action"], action.config_schema).iter_errors(config), key=str)
        if problems:
            message = f"config invalid after rendering at /{'/'.join(map(str, problems[0].absolute_path))}"
            return self._step_failed(step_run, step, attempt, Envelope.failure(
                ErrorCode.INVALID_ARGUMENT, message, retryable=False))  # fmt: skip
        capability = self._describe(step, config)
        if capability is None or (step["action"] == "call_capability" and capability.handler is None):
            capability_id = config.get("capability", step["action"])
            return self._step_failed(step_run, step, attempt, Envelope.failure(
                ErrorCode.CAPABILITY_NOT_FOUND, f"unknown capability '{capability_id}'", retryable=False))  # fmt: skip
        if step["action"] == "call_capability":
            bad = next(
                Draft202012Validator(capability.input_schema).iter_errors(config.get("args") or {}), None
            )
            if bad is not None:
                where = "/".join(map(str, bad.absolute_path))
                return self._step_failed(step_run, step, attempt, Envelope.failure(
                    ErrorCode.INVALID_ARGUMENT, f"args do not match {capability.id}'s input schema at /{where}",
                    retryable=False))  # fmt: skip

        gate = self._gate(step_run, step, config, capability)
        if gate is not True:
            return gate
        spent = Decimal(self.run.cost_usd)
        cap = self.execution.get("budget_cap_usd")
        if cap is not None and spent + capability.estimate_cost(config) > Decimal(str(cap)):
            return self._step_failed(step_run, step, attempt, Envelope.failure(
                ErrorCode.BUDGET_EXCEEDED, "the run's budget cap would be exceeded", retryable=False))  # fmt: skip
        return self._call(step_run, step, attempt, config, capability)

    def _gate(
        self, step_run: StepRun, step: dict, config: dict, capability: Capability
    ) -> bool | Parked | None:
        risk, reasons = runtime.risk_for(step["step_id"], step["action"], config, capability)
        decision = (
            policy.Decision.CONFIRM
            if step["action"] == "require_approval"
            else policy.gate(self.autonomy, risk)
        )
        if self.autonomy == "A0":
            decision = policy.Decision.PREVIEW
        if decision == policy.Decision.ALLOW:
            return True
        if decision == policy.Decision.BLOCK:
            self._audit("gate.blocked", f"{step['step_id']}: {risk.label} risk is blocked at {self.autonomy}",
                        Outcome.FAILURE, refs={"step": step["step_id"]})  # fmt: skip
            return self._step_failed(step_run, step, step_run.attempt + 1, Envelope.failure(
                ErrorCode.POLICY_VIOLATION,
                f"a {risk.label}-risk step is not allowed at autonomy {self.autonomy}", retryable=False))  # fmt: skip
        if decision == policy.Decision.PREVIEW:
            return self._preview(step_run, step, config, capability, risk)
        verdict = runtime.approval_gate(
            run=self.run, step_run=step_run, step=step, config=config, capability=capability,
            risk=risk, reasons=reasons,
        )  # fmt: skip
        if verdict.status == "approved":
            return True
        if verdict.status == "pending":
            with transaction.atomic(savepoint=False):
                self._save_step(step_run, status=StepStatus.AWAITING_APPROVAL)
                self._update_run(status=RunStatus.AWAITING_APPROVAL, claimed_by="", lease_expires_at=None)
            return Parked(RunStatus.AWAITING_APPROVAL)
        code = {"denied": ErrorCode.APPROVAL_DENIED, "expired": ErrorCode.APPROVAL_EXPIRED}.get(
            verdict.status, ErrorCode.POLICY_VIOLATION
        )
        return self._step_failed(step_run, step, step_run.attempt + 1,
                                 Envelope.failure(code, verdict.message, retryable=False))  # fmt: skip

    def _preview(self, step_run: StepRun, step: dict, config: dict, capability: Capability, risk) -> None:
        preview = {"preview": True, "action": step["action"], "rendered_config": config, "risk": risk.label}
        envelope = Envelope.success(preview, summary=f"dry run at autonomy {self.autonomy}: not executed")
        self._store_outcome(step_run, step, step_run.attempt + 1, config, envelope, bind_output=False)
        return None

    def _call(self, step_run: StepRun, step: dict, attempt: int, config: dict, capability: Capability):
        step_id = step["step_id"]
        key = idempotency_key(str(self.run.pk), step_id, attempt, config)
        timeout = self._step_timeout(step, capability)
        now = timezone.now()
        lease = now + timedelta(seconds=timeout + settings.AUTOPLANE_RUN_LEASE_SECONDS)
        started = False
        if capability.has_side_effects and self.batching:
            # The checkpoint must be committed before the call, never inside a batch.
            raise RuntimeError("a step with side effects reached the executor inside a transaction")
        if capability.has_side_effects:
            with transaction.atomic(savepoint=False):
                self._save_step(
                    step_run,
                    status=StepStatus.RUNNING, attempt=attempt, idempotency_key=key, started_at=now,
                    rendered_config=config, finished_at=None,
                )  # fmt: skip
                self._update_run(lease_expires_at=lease)
                self._audit("step.started", f"{step_id} started (attempt {attempt})", refs={"step": step_id},
                            payload={"action": step["action"], "idempotency_key": key})  # fmt: skip
            started = True
        meter = runtime.cost_meter(self.run)
        tools = ToolGateway(run=self.run, step_run=step_run, step=step, config=config, autonomy=self.autonomy)
        saved: dict[str, Any] = {}
        ctx = runtime.action_context(
            self.run, step, attempt, key, timeout, cost_meter=meter, call_tool=tools,
            resume_state=step_run.checkpoint, save_state=lambda state: saved.update(state=copy.deepcopy(state)),
        )  # fmt: skip
        tools.ctx = ctx
        # However long the handler runs, with or without side effects, this worker keeps the run.
        keeper = nullcontext() if self.batching else LeaseKeeper(str(self.run.pk), self.me)
        try:
            with keeper:
                if step["action"] == "call_capability":
                    envelope = capability.handler(ctx, config.get("args") or {})
                else:
                    envelope = registry.get_action(step["action"]).handler(ctx, config)
        except AwaitingApproval:
            return self._park_mid_step(step_run, step, attempt, redact(config, ctx.secrets), saved.get("state"),
                                       meter, started, now)  # fmt: skip
        except StepFailure as exc:
            if exc.detail:
                logger.info("step %s failed: %s", step_id, exc.detail)
            envelope = Envelope.failure(exc.code, exc.message, retryable=exc.retryable)
        except Exception:
            logger.exception("run %s step %s: handler raised", self.run.pk, step_id)
            envelope = Envelope.failure(
                ErrorCode.INTERNAL, "the step failed with an internal error", retryable=False
            )
        envelope = _charged(runtime.redacted(envelope, ctx.secrets), meter)
        stored_config = redact(config, ctx.secrets)
        if envelope.resume_at is not None and envelope.ok:
            return self._park_until(step_run, step, attempt, stored_config, envelope, started)
        if not envelope.ok:
            return self._step_failed(step_run, step, attempt, envelope, stored_config, started, now)
        self._store_outcome(step_run, step, attempt, stored_config, envelope, started=started, started_at=now)
        return None

    def _step_timeout(self, step: dict, capability: Capability) -> float:
        declared = float(
            step.get("timeout_seconds", max(capability.expected_duration_seconds, DEFAULT_STEP_TIMEOUT))
        )
        remaining = (self.deadline - timezone.now()).total_seconds()
        return max(0.1, min(declared, remaining))

    # --- outcomes ------------------------------------------------------------

    def _store_outcome(self, step_run, step, attempt, config, envelope: Envelope, *, started=False,
                       started_at=None, bind_output=True) -> None:  # fmt: skip
        step_id = step["step_id"]
        now = timezone.now()
        with transaction.atomic(savepoint=False):
            self._save_step(
                    step_run,
                status=StepStatus.SUCCEEDED, attempt=attempt, rendered_config=config, output=envelope.as_dict(),
                error_code="", error_message="", cost_usd=step_run.cost_usd + envelope.cost_usd, checkpoint=None,
                started_at=started_at or now, finished_at=now,
            )  # fmt: skip
            fields: dict[str, Any] = {"step_index": self.run.step_index + 1}
            if bind_output and step.get("output_as"):
                fields["context"] = {**self.run.context, step["output_as"]: envelope.data}
            if envelope.cost_usd:
                fields["cost_usd"] = Decimal(self.run.cost_usd) + envelope.cost_usd
            self._update_run(**fields)
            if not started:
                self._audit("step.started", f"{step_id} started (attempt {attempt})", refs={"step": step_id},
                            payload={"action": step["action"]})  # fmt: skip
            self._audit("step.succeeded", f"{step_id} succeeded" + (f": {envelope.summary}" if envelope.summary else ""),
                        Outcome.SUCCESS, refs={"step": step_id}, payload={"cost_usd": str(envelope.cost_usd)})  # fmt: skip

    def _skip(self, step_run: StepRun, step: dict) -> None:
        with transaction.atomic(savepoint=False):
            now = timezone.now()
            self._save_step(step_run, status=StepStatus.SKIPPED, started_at=now, finished_at=now)
            self._update_run(step_index=self.run.step_index + 1)
            self._audit(
                "step.skipped", f"{step['step_id']} skipped: 'when' was false", refs={"step": step["step_id"]}
            )

    def _advance(self) -> None:
        self._update_run(step_index=self.run.step_index + 1)

    def _park_mid_step(
        self, step_run, step, attempt, config, state, meter, started: bool, started_at
    ) -> Parked:
        """A handler is waiting for a human (an agent's tool call): keep its state and what it spent."""
        with transaction.atomic(savepoint=False):
            self._save_step(step_run, status=StepStatus.AWAITING_APPROVAL, attempt=attempt, rendered_config=config,
                            checkpoint=state, cost_usd=step_run.cost_usd + meter.total, started_at=started_at)  # fmt: skip
            fields: dict[str, Any] = {
                "status": RunStatus.AWAITING_APPROVAL,
                "claimed_by": "",
                "lease_expires_at": None,
            }
            if meter.total:
                fields["cost_usd"] = Decimal(self.run.cost_usd) + meter.total
            self._update_run(**fields)
            if not started:
                self._audit("step.started", f"{step['step_id']} started (attempt {attempt})",
                            refs={"step": step["step_id"]}, payload={"action": step["action"]})  # fmt: skip
        return Parked(RunStatus.AWAITING_APPROVAL)

    def _park_until(self, step_run, step, attempt, config, envelope: Envelope, started: bool) -> Parked:
        wake_at = envelope.resume_at
        self._store_outcome(step_run, step, attempt, config, envelope, started=started)
        with transaction.atomic(savepoint=False):
            self._update_run(status=RunStatus.WAITING, wake_at=wake_at, claimed_by="", lease_expires_at=None)
            self._audit("run.waiting", f"waiting until {wake_at.isoformat()}", refs={"step": step["step_id"]})
        run_wake_at(self.run, wake_at)
        return Parked(RunStatus.WAITING, wake_at)

    def _step_failed(self, step_run, step, attempt, envelope: Envelope, config=None, started=False,
                     started_at=None) -> Parked | None:  # fmt: skip
        step_id = step["step_id"]
        error = envelope.error or {"code": ErrorCode.INTERNAL, "message": "failed", "retryable": False}
        max_retries = int(step.get("max_retries", self.execution.get("max_retries", 0)))
        now = timezone.now()
        retry = bool(error.get("retryable")) and attempt <= max_retries
        with transaction.atomic(savepoint=False):
            self._save_step(
                    step_run,
                status=StepStatus.PENDING if retry else StepStatus.FAILED, attempt=attempt,
                rendered_config=config, output=envelope.as_dict(), error_code=error["code"],
                error_message=error["message"][:500], started_at=started_at or now, finished_at=now,
                cost_usd=step_run.cost_usd + envelope.cost_usd, checkpoint=None,
            )  # fmt: skip
            if envelope.cost_usd:
                self._update_run(cost_usd=Decimal(self.run.cost_usd) + envelope.cost_usd)
            if not started:
                self._audit("step.started", f"{step_id} started (attempt {attempt})", refs={"step": step_id},
                            payload={"action": step["action"]})  # fmt: skip
            if retry:
                delay = backoff_seconds(step.get("retry_backoff", self.execution.get("retry_backoff", "exponential")),
                                        attempt)  # fmt: skip
                wake_at = now + timedelta(seconds=delay)
                self._update_run(
                    status=RunStatus.WAITING, wake_at=wake_at, claimed_by="", lease_expires_at=None
                )
                self._audit("step.retrying", f"{step_id} failed ({error['code']}); retry {attempt} in {delay:.1f}s",
                            Outcome.FAILURE, refs={"step": step_id},
                            payload={"error": error, "attempt": attempt, "delay_seconds": delay})  # fmt: skip
        if retry:
            run_wake_at(self.run, wake_at)
            return Parked(RunStatus.WAITING, wake_at)
        with transaction.atomic(savepoint=False):
            self._audit("step.failed", f"{step_id} failed: {error['code']}", Outcome.FAILURE, refs={"step": step_id},
                        payload={"error": error, "attempt": attempt})  # fmt: skip
        self._fail({"code": error["code"], "message": error["message"], "step_id": step_id})
        return Parked(self.run.status) if self.run.status in FINAL_RUN_STATUSES else None

    # --- finishing -----------------------------------------------------------

    def _fail(self, error: dict[str, Any], status: str = RunStatus.FAILED) -> None:
        """Record the failure; switch to ``on_failure`` steps if there are any still to run."""
        if self.run.phase == PLAN and self.execution.get("on_failure"):
            with transaction.atomic(savepoint=False):
                self._update_run(phase=ON_FAILURE, step_index=0, error={**error, "final_status": status})
                self._audit("run.on_failure", f"running on_failure steps after {error['code']}", Outcome.FAILURE,
                            payload={"error": error})  # fmt: skip
            return
        final = (self.run.error or {}).get("final_status", status) if self.run.phase == ON_FAILURE else status
        first_error = self.run.error if self.run.phase == ON_FAILURE and self.run.error else error
        self._finish(final, error={k: v for k, v in first_error.items() if k != "final_status"})

    def _finish_phase(self) -> None:
        if self.run.phase == PLAN:
            self._finish(RunStatus.SUCCEEDED, output=self._output())
        else:
            self._fail(self.run.error or {"code": ErrorCode.INTERNAL, "message": "failed"})

    def _output(self) -> Any:
        done = [
            s
            for (phase, _), s in sorted(self.step_runs.items())
            if phase == PLAN and s.status == StepStatus.SUCCEEDED
        ]
        return done[-1].output.get("data") if done and done[-1].output else None

    def _finish(self, status: str, *, output: Any = None, error: dict | None = None) -> None:
        with transaction.atomic(savepoint=False):
            self._update_run(status=status, output=output, error=error, finished_at=timezone.now(),
                             claimed_by="", lease_expires_at=None)  # fmt: skip
            outcome = Outcome.SUCCESS if status == RunStatus.SUCCEEDED else Outcome.FAILURE
            detail = f": {error['code']}" if error else ""
            self._audit(f"run.{status}", f"run {status}{detail}", outcome,
                        payload={"error": error, "cost_usd": str(self.run.cost_usd)})  # fmt: skip
            if status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT):
                kind = "succeeded" if status == RunStatus.SUCCEEDED else "failed"
                events.publish(
                    workspace_id=self.run.workspace_id, event_type=f"automation.run.{kind}",
                    source=f"automation:{self.run.automation_id}", trace_id=self.run.trace_id,
                    chain_depth=self.run.chain_depth + 1, parent_run_id=str(self.run.pk),
                    principal_ids=self.run.principal_ids,
                    payload={"automation_id": str(self.run.automation_id),
                             "automation_name": self.snapshot.get("name"), "run_id": str(self.run.pk),
                             "status": status, "output": output, "error": error},
                )  # fmt: skip
        run_settled(self.run)


_validators: dict[str, Draft202012Validator] = {}


def _validator(name: str, schema: Any) -> Draft202012Validator:
    if name not in _validators:
        _validators[name] = Draft202012Validator(schema)
    return _validators[name]


def idempotency_key(run_id: str, step_id: str, attempt: int, config: Any) -> str:
    material = f"{run_id}\x00{step_id}\x00{attempt}\x00{writer.canonical_json(config)}"
    return hashlib.sha256(material.encode()).hexdigest()


def backoff_seconds(kind: str, attempt: int) -> float:
    base = float(settings.AUTOPLANE_RETRY_BASE_SECONDS)
    if kind == "none":
        delay = 0.0
    elif kind == "linear":
        delay = base * attempt
    else:
        delay = base * (2 ** (attempt - 1))
    delay = min(delay, MAX_BACKOFF_SECONDS)
    return delay * random.uniform(0.8, 1.2)  # jitter spreads retries of many runs  # noqa: S311


def _charged(envelope: Envelope, meter: CostMeter) -> Envelope:
    """Charge a cost the handler reported (the budget is re-checked); the step's cost is the meter's."""
    if envelope.cost_usd:
        try:
            meter.charge(envelope.cost_usd, "reported by the handler")
        except StepFailure as exc:
            envelope = Envelope.failure(exc.code, exc.message, retryable=False)
    envelope.cost_usd = meter.total
    if meter.usage and not envelope.usage:
        envelope.usage = dict(meter.usage)
    return envelope


def execute_run(run_id: str, me: str | None = None) -> str | None:
    """Claim a run and drive it as far as it can go; returns the status it left in."""
    me = me or worker_id()
    run = claim(run_id, me)
    if run is None:
        return None
    if run.status in FINAL_RUN_STATUSES:
        return run.status
    executor = Executor(run, me)
    executor.execute()
    return executor.run.status
