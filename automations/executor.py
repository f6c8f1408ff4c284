"""The step loop (SPEC §7.2): a loop with bookkeeping, not an agent. No Celery here.

Crash safety rests on three rules:

* **Claim** (``claim.py``). A worker owns a run only after a conditional UPDATE
  moved it to ``running`` with its id and a lease; every later write here is
  fenced on that claim, so a redelivered message or a second worker changes nothing.
* **Checkpoint before a slow or side-effecting call.** The step is recorded as
  ``running`` (with its idempotency key) and committed *before* its handler is
  called; its outcome is committed after. Quick steps without side effects
  (milliseconds) share one transaction instead, being safe to repeat; the
  first such stretch shares the claim's transaction (:meth:`Executor.begin`),
  so a crash before its commit leaves the run unclaimed, as if never started.
* **Recovery** (``recovery.py``). A claim that finds the current step ``running``
  with no outcome knows the previous worker died mid-call: a step safe to retry
  gets a new attempt; any other becomes ``OUTCOME_UNKNOWN`` and the run
  ``needs_attention`` for an operator — never a guessed success; past
  ``AUTOPLANE_MAX_RECOVERIES`` the run fails with ``RECOVERY_LIMIT``.
* **Transient database errors are waited out** (``transient.py``): a claim or a
  write that meets a restarted database or a killed connection reconnects and
  goes on where it was; a step's outcome is never lost to one.

Step statuses (docs/concepts.md): pending → running → succeeded | failed |
cancelled; a ``wait`` step is ``waiting`` until its timer fires; steps a failed
or cancelled run never reached are ``skipped``.

Preparing a step (render, validate, describe, risk) is ``steps.py``; the gate
is ``gating.py``; what happened is written by ``outcomes.py``; this module only
sequences them.
"""

from __future__ import annotations

import copy
import logging
from contextlib import ExitStack
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals import policy
from approvals.services import approvals_settle_for_step
from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from capabilities.base import AwaitingApproval, Envelope, ErrorCode, StepFailure
from config import instruments, logs, tracing

from . import approval_edits, gating, recovery, replay, steps, transient
from .action_context import action_context, cost_meter
from .agent_tools import ToolGateway
from .claim import LostClaim, claim, worker_id
from .models import FINAL_RUN_STATUSES, Run, RunStatus, StepRun, StepStatus
from .outcomes import Parked, RunRecorder, charged, redacted
from .steps import PLAN, PreparedStep
from .watch import StepWatch

logger = logging.getLogger(__name__)


class Executor(RunRecorder):
    """Drives a claimed run step by step; what happened is recorded by :class:`RunRecorder`."""

    def __init__(self, run: Run, me: str, *, careful: bool = False):
        super().__init__(run, me)
        # The claim just read the row: the first step needs no fresh look at the cancel flag.
        self.fresh = True
        self.batching = False
        # No quick stretches: every step checkpointed, so a step that kills its worker is seen (recovery.py).
        self.careful = careful

    # --- the loop ------------------------------------------------------------

    def begin(self) -> bool:
        """In the claim's transaction: recovery, the start, and the run's first quick steps.

        The claim, the run's start and a first stretch of quick steps (often the whole
        run and its end) commit together: a crash or error before the commit rolls
        the claim back too, and the run is claimed afresh, as if it never started.
        The claim's UPDATE holds the run's row until then, so no cancel can arrive
        meanwhile and the run's own writes are merged into one statement
        (``row_locked``); on PostgreSQL the run's final UPDATE, its new step rows, its
        event and its audit entries then go in one round trip (``keep_writes``), with
        the COMMIT when the run ends here, each fence checked in SQL before it (a miss
        rolls all of it back). False: the run left this worker.
        """
        self.row_locked = True
        self.keep_writes()  # the run's end, its new step rows, event and audit: one round trip
        try:
            going_on = recovery.recover(self)
            if going_on:
                self._start()
                if self._quick_step_next():
                    going_on = not self._quick_batch()
            self._flush_run()
            return going_on
        except LostClaim:
            logger.info("run %s: claim lost to another worker; stopping", self.run.pk)
            return False
        finally:
            self.row_locked = False
            self._kept = None

    def execute(self) -> None:
        """Drive the run on from where :meth:`begin` left it (its transaction committed)."""
        try:
            while True:
                if self._quick_step_next():
                    # Steps without side effects that finish in milliseconds are safe to
                    # repeat after a crash, so a run of them (and the run's end) share one
                    # transaction instead of committing step by step, and their audit
                    # events one INSERT.
                    with transaction.atomic(), writer.batch():
                        done = self._quick_batch()
                else:
                    done = self._advance_while(lambda: True, limit=1)
                if done:
                    return
        except LostClaim:
            logger.info("run %s: claim lost to another worker; stopping", self.run.pk)

    def _quick_batch(self) -> bool:
        self.batching = True
        try:
            with self.steps_inserted_together():
                return self._advance_while(self._quick_step_next)
        finally:
            self.batching = False

    def _advance_while(self, condition, limit: int | None = None) -> bool:
        """Run steps while ``condition()`` holds; True once the run left this worker."""
        count = 0
        while limit is None or count < limit:
            if self._stop_requested():
                return True
            plan = steps.steps_of(self.run, self.run.phase)
            if self.run.step_index >= len(plan):
                self._finish_phase()
                return True
            if count and not condition():
                return False
            if self._run_step(plan[self.run.step_index]) is not None:
                return True
            count += 1
        return False

    def _quick_step_next(self) -> bool:
        plan = steps.steps_of(self.run, self.run.phase)
        if self.run.step_index >= len(plan):
            return True  # finishing is quick too
        return not self.careful and steps.is_quick(plan[self.run.step_index], self.run.workspace_id)

    def _start(self) -> None:
        now = timezone.now()
        for step_run in self.step_runs.values():
            if step_run.status == StepStatus.WAITING:  # its timer fired: that is how we got here
                self._save_step(step_run, status=StepStatus.SUCCEEDED, finished_at=now)
        if not getattr(self.run, "first_claim", False):
            return
        self.run.first_claim = False
        queued_ms = (self.run.started_at - self.run.created_at).total_seconds() * 1000
        instruments.run_started(queue=self.run.queue, enqueued_at=self.run.enqueued_at or self.run.created_at,
                                started_at=self.run.started_at)  # fmt: skip
        self._audit("run.started", f"run started on {self.run.queue}", payload={"queue_wait_ms": queued_ms})

    def _stop_requested(self) -> bool:
        if self.fresh or self.row_locked:  # what the claim read is still what the row says
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

    def _step_run(self, step: dict[str, Any]) -> StepRun:
        """This step's row; unsaved until the step is checkpointed or has an outcome."""
        key = (self.run.phase, self.run.step_index)
        if key not in self.step_runs:
            self.step_runs[key] = StepRun(run=self.run, phase=key[0], index=key[1], step_id=step["step_id"],
                                          action=step["action"])  # fmt: skip
        return self.step_runs[key]

    def _run_step(self, step: dict[str, Any]) -> Parked | None:
        logs.bind(step_id=step["step_id"])
        step_run = self._step_run(step)
        if step_run.status in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):  # reused by a re-run
            if step_run.status == StepStatus.SUCCEEDED and steps.reused_from(step_run):
                parked = self._gate_reused(step_run, step)
                if parked is not None:
                    return parked
            self._update_run(step_index=self.run.step_index + 1)
            return None
        attempt = step_run.attempt + 1
        prepared = steps.prepare(self.run, step, attempt)
        if isinstance(prepared, PreparedStep) and step_run.pk is not None:
            # It parked (or ran) before: an approver's edit of its config runs instead of the render.
            prepared = approval_edits.edited_step(self.run, step_run, prepared)
        if prepared is steps.SKIP:
            return self._skip(step_run, step)
        if isinstance(prepared, Envelope):
            if step_run.status == StepStatus.AWAITING_APPROVAL:  # its approval will never be used
                approvals_settle_for_step(
                    run_id=self.run.pk, step_key=f"{step_run.phase}:{step_run.index}:{step['step_id']}",
                    actor=f"run:{self.run.pk}", reason=f"the step cannot run: {prepared.summary}",
                )  # fmt: skip
            return self._step_failed(step_run, step, attempt, prepared)
        assert isinstance(prepared, PreparedStep)
        result = gating.gate(self.run, step_run, prepared, self.autonomy)
        if result.outcome == gating.GateOutcome.PREVIEW:
            preview = {"preview": True, "action": step["action"], "rendered_config": prepared.config,
                       "risk": prepared.risk.label}  # fmt: skip
            envelope = Envelope.success(preview, summary=f"dry run at autonomy {self.autonomy}: not executed")
            self._store_outcome(step_run, step, attempt, prepared.config, envelope, bind_output=False)
            return None
        if result.outcome == gating.GateOutcome.PARK:
            with transaction.atomic(savepoint=False):
                self._save_step(step_run, status=StepStatus.AWAITING_APPROVAL)
                self._update_run(status=RunStatus.AWAITING_APPROVAL, claimed_by="", lease_expires_at=None)
            return Parked(RunStatus.AWAITING_APPROVAL)
        if result.outcome == gating.GateOutcome.REFUSE:
            assert result.envelope is not None
            if result.blocked:
                self._audit("gate.blocked", f"{step['step_id']}: {result.envelope.summary}", Outcome.FAILURE,
                            refs={"step": step["step_id"]}, payload={"reasons": prepared.reasons})  # fmt: skip
            return self._step_failed(step_run, step, attempt, result.envelope)
        return self._call(step_run, step, attempt, prepared)

    def _gate_reused(self, step_run: StepRun, step: dict[str, Any]) -> Parked | None:
        """A re-run from a later step walks past this step's reused outcome; if the step would be gated
        now (``require_approval``, or its risk at this autonomy), a human says yes again first: the yes
        given to the original run does not carry over (issue 29). Nothing is executed again."""
        prepared = steps.prepare_reused(self.run, step, step_run.rendered_config)
        if isinstance(prepared, Envelope):
            return self._step_failed(step_run, step, step_run.attempt, prepared)
        decision = gating.decision_for(prepared, self.autonomy)
        if decision in (policy.Decision.ALLOW, policy.Decision.PREVIEW):
            return None
        verdict = gating.approval_verdict(
            self.run, step_run, prepared, self.autonomy, extra={"rerun_of": steps.reused_from(step_run)}
        )
        if verdict.status == "approved":
            return None
        if verdict.status == "pending":
            with transaction.atomic(savepoint=False):  # the row keeps its reused outcome while the run waits
                self._update_run(status=RunStatus.AWAITING_APPROVAL, claimed_by="", lease_expires_at=None)
            return Parked(RunStatus.AWAITING_APPROVAL)
        code = verdict.code or {
            "denied": ErrorCode.APPROVAL_DENIED,
            "expired": ErrorCode.APPROVAL_EXPIRED,
        }.get(verdict.status, ErrorCode.POLICY_VIOLATION)
        return self._step_failed(step_run, step, step_run.attempt, Envelope.failure(code, verdict.message,
                                                                                    retryable=False))  # fmt: skip

    def _call(self, step_run: StepRun, step: dict, attempt: int, prepared: PreparedStep) -> Parked | None:
        step_id, config, capability = step["step_id"], prepared.config, prepared.capability
        # One logical call, one key: a call re-sent after an unknown outcome (worker lost,
        # timeout, connection dropped, an operator's "retry") or a "not processed" answer
        # keeps the key it was first sent with; a definite failure clears it (outcomes.py).
        key = step_run.idempotency_key or steps.idempotency_key(str(self.run.pk), step_id, attempt, config)
        timeout = steps.step_timeout(step, capability.expected_duration_seconds, self.deadline)
        now = timezone.now()
        if capability.has_side_effects and self.batching:
            # The checkpoint must be committed before the call, never inside a batch.
            raise RuntimeError("a step with side effects reached the executor inside a transaction")
        started = not self.batching
        if started:  # the step shows running while its handler runs, and the lease covers it
            with transaction.atomic(savepoint=False):
                self._save_step(step_run, status=StepStatus.RUNNING, attempt=attempt, idempotency_key=key,
                                started_at=now, rendered_config=config, finished_at=None)  # fmt: skip
                self._update_run(
                    lease_expires_at=now + timedelta(seconds=timeout + settings.AUTOPLANE_RUN_LEASE_SECONDS)
                )
                self._audit("step.started", f"{step_id} started (attempt {attempt})", refs={"step": step_id},
                            payload={"action": step["action"], "idempotency_key": key})  # fmt: skip
        meter = cost_meter(self.run)
        tools = ToolGateway(run=self.run, step_run=step_run, step=step, config=config, autonomy=self.autonomy)
        saved: dict[str, Any] = {}
        ctx = action_context(
            self.run, step, attempt, key, timeout, cost_meter=meter, call_tool=tools,
            resume_state=step_run.checkpoint, save_state=lambda state: saved.update(state=copy.deepcopy(state)),
        )  # fmt: skip
        tools.ctx = ctx
        try:
            with ExitStack() as watching:
                watching.enter_context(tracing.span(f"step {step_id}", **{
                    "autoplane.step_id": step_id, "autoplane.action": step["action"], "autoplane.attempt": attempt,
                    "autoplane.trace_id": self.run.trace_id}))  # fmt: skip
                if started:  # however long the handler runs, this worker keeps the run and hears a cancel
                    cancelled = ctx.cancelled if prepared.action.interruptible else None
                    watching.enter_context(StepWatch(str(self.run.pk), self.me, cancelled))
                stand_in = replay.current()  # ``automations test``: a recorded output instead of the call
                if stand_in is not None and stand_in.stands_in(step):
                    envelope = stand_in.call(step, config)
                else:
                    envelope = prepared.action.handler(ctx, config)
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
        envelope = charged(redacted(envelope, ctx.secrets), meter)
        stored_config = redact(config, ctx.secrets)
        # A handler that read the cancel flag itself stopped for the cancel too, even before the watch heard it.
        if ctx.cancelled.is_set() or (envelope.error or {}).get("code") == ErrorCode.CANCELLED:
            return self._recorded(lambda: self._interrupted(step_run, step, attempt, stored_config, envelope))
        if envelope.resume_at is not None and envelope.ok:
            return self._recorded(
                lambda: self._park_until(step_run, step, attempt, stored_config, envelope, started)
            )
        if not envelope.ok:
            return self._recorded(
                lambda: self._step_failed(step_run, step, attempt, envelope, stored_config, started, now)
            )
        return self._recorded(lambda: self._store_outcome(
            step_run, step, attempt, stored_config, envelope, started=started, started_at=now))  # fmt: skip


def execute_run(run_id: str, me: str | None = None, *, careful: bool = False) -> str | None:
    """Claim a run and drive it as far as it can go; returns the status it left in.

    ``careful``: the broker gave this run's message back, so a worker died holding it,
    perhaps inside a quick stretch, which leaves no trace (its transaction, the claim's
    too, rolled back). This time every step is checkpointed ``running`` before its
    handler, so a step that kills its worker again is recovered and counted like any
    other, up to ``AUTOPLANE_MAX_RECOVERIES`` (see :mod:`.recovery`).

    A transient database error (a restart, a killed connection) anywhere but a
    call's outcome (retried where it is recorded) starts over from the database's
    state: this worker takes back the run it holds and goes on from its last
    committed step. A step that was running is recovered as after a crash, but is
    not counted as a recovery.
    """
    me = me or worker_id()
    held = False

    def attempt() -> str | None:
        with transaction.atomic(), writer.batch():  # see Executor.begin
            run = claim(run_id, me, held=held)
            if run is None:
                return None
            if run.status in FINAL_RUN_STATUSES:
                return run.status
            executor = Executor(run, me, careful=careful)
            with logs.bound(run_id=str(run.pk), trace_id=run.trace_id, workspace=run.workspace_id):
                going_on = executor.begin()
        if going_on:
            with (
                logs.bound(run_id=str(run.pk), trace_id=run.trace_id, workspace=run.workspace_id),
                tracing.span("run", **{"autoplane.run_id": str(run.pk), "autoplane.trace_id": run.trace_id,
                                       "autoplane.queue": run.queue}),
            ):  # fmt: skip
                executor.execute()
        return executor.run.status

    def again() -> None:
        nonlocal held
        held = True  # a claim whose commit was lost on the way back is ours too

    return transient.with_retries(attempt, f"run {run_id}", before_retry=again)


__all__ = ["Executor", "LostClaim", "Parked", "claim", "execute_run", "worker_id"]
