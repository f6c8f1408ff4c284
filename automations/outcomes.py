"""What a run's steps and end are recorded as (SPEC §7.2), fenced on the worker's claim.

:class:`RunRecorder` holds the run this worker claimed and writes its outcomes:
a step succeeded, is waiting on a timer, failed (and is retried or fails the
run), was skipped, or was interrupted by a cancel; the run finished. Every run
write is conditional on ``claimed_by`` and the status this worker last saw, so
a worker that lost its claim raises :class:`~automations.claim.LostClaim` and
writes nothing. Each outcome is committed together with its audit rows.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from capabilities.base import CostMeter, Envelope, ErrorCode, StepFailure
from config import instruments, one_round_trip
from workspaces.models import effective_autonomy

from . import events, transient
from .claim import LostClaim
from .concurrency import run_settled
from .enqueue import run_wake_at
from .models import FINAL_RUN_STATUSES, Run, RunStatus, StepRun, StepStatus
from .steps import ON_FAILURE, PLAN, definite_failure
from .transitions import check_transition, log_change, skip_unreached

DEFAULT_RUN_TIMEOUT = 3600.0
_RUN_UPDATES: dict[tuple[str, ...], str] = {}  # the fenced run UPDATE's SQL by the fields it sets
MAX_BACKOFF_SECONDS = 300.0


@dataclass
class Parked:
    """The run left the worker: waiting for a retry, a timer or an approval, or final."""

    status: str
    wake_at: datetime | None = None


class RunRecorder:
    def __init__(self, run: Run, me: str):
        self.run = run
        self.me = me
        # A run claimed for the first time has no step rows: nothing to read.
        rows = StepRun.objects.filter(run=run) if getattr(run, "has_step_runs", True) else ()
        self.step_runs = {(s.phase, s.index): s for s in rows}
        # While this worker's transaction holds the run's row (Executor.begin), run writes
        # that keep its status wait in ``_pending`` and go with the next write (or the flush).
        self.row_locked = False
        self._pending: dict[str, Any] = {}
        self._unsaved_steps: list[StepRun] | None = None  # see steps_inserted_together
        # Writes kept back to go in one round trip with the rest (see _send_kept); None: each goes at once.
        self._kept: (
            list[tuple[one_round_trip.Statement, Callable[[one_round_trip.Result], None] | None]] | None
        )
        self._kept = None
        self._commit_with_end = False
        self.execution = run.snapshot.get("execution") or {}
        # The definition's own autonomy, else the workspace's default as it is now, never above the
        # workspace's ceiling (max_autonomy): resolved each time a worker takes the run, never
        # frozen into the definition (docs/concepts.md).
        self.autonomy = effective_autonomy(
            self.execution.get("autonomy"), run.workspace.default_autonomy, run.workspace.max_autonomy
        )
        timeout = float(self.execution.get("timeout_seconds", DEFAULT_RUN_TIMEOUT))
        self.deadline = run.started_at + timedelta(seconds=timeout)

    # --- fenced writes ---------------------------------------------------------

    def _update_run(self, **fields: Any) -> None:
        """Write run fields only while this worker still holds the claim."""
        if "status" in fields:
            check_transition(self.run.status, fields["status"])
        elif self.row_locked and not any(hasattr(value, "resolve_expression") for value in fields.values()):
            self._pending.update(fields)  # nobody else can write the row before we do
            for name, value in fields.items():
                setattr(self.run, name, value)
            return
        self._send_kept()  # what was kept back goes first: this UPDATE's fence reads what it wrote
        fields = {**self._pending, **fields}
        self._pending = {}
        updated = Run.objects.filter(pk=self.run.pk, claimed_by=self.me, status=self.run.status).update(
            **fields
        )
        if not updated:
            raise LostClaim(str(self.run.pk))
        if "status" in fields and fields["status"] != self.run.status:
            error = fields.get("error") or {}
            log_change(self.run.pk, fields["status"], old=self.run.status,
                       detail=f"{error.get('code', '')} {error.get('message', '')}".strip()[:200])  # fmt: skip
        for name, value in fields.items():
            if not hasattr(value, "resolve_expression"):
                setattr(self.run, name, value)

    def _flush_run(self) -> None:
        """Write what :meth:`_update_run` kept back (before the row's lock goes)."""
        if self._kept is not None:
            self._send_kept()
        elif self._pending:
            pending, self._pending = self._pending, {}
            if not Run.objects.filter(pk=self.run.pk, claimed_by=self.me, status=self.run.status).update(
                **pending
            ):
                raise LostClaim(str(self.run.pk))

    def _audit(self, type: str, summary: str, outcome: str = Outcome.INFO, **extra: Any) -> None:
        writer.append(
            trace_id=self.run.trace_id, type=type, summary=summary, outcome=outcome,
            workspace_id=self.run.workspace_id, stage="execute",
            refs={"run": str(self.run.pk), "automation": str(self.run.automation_id), **extra.pop("refs", {})},
            actor=f"worker:{self.me}", payload=extra.pop("payload", {}),
        )  # fmt: skip

    def _save_step(self, step_run: StepRun, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(step_run, name, value)
        if step_run.pk is not None:
            self._send_kept()
            StepRun.objects.filter(pk=step_run.pk).update(**fields)
        elif self._unsaved_steps is None:
            step_run.save(force_insert=True)
        elif all(row is not step_run for row in self._unsaved_steps):
            self._unsaved_steps.append(step_run)  # inserted, as it is then, by insert_steps()

    @contextmanager
    def steps_inserted_together(self) -> Iterator[None]:
        """New step rows saved inside the block are written in one multi-row INSERT when it ends.

        For a stretch of quick steps in one transaction: nothing reads their rows back
        before it commits, so N steps cost one INSERT instead of N.
        """
        self._unsaved_steps = []
        try:
            yield
            rows, self._unsaved_steps = self._unsaved_steps, None
            if rows:
                StepRun.objects.bulk_create(rows)
        finally:
            self._unsaved_steps = None

    def _recorded(self, record: Callable[[], Parked | None]) -> Parked | None:
        """Record a call's outcome, again after a transient database error: the call is not repeated.

        A failed transaction left the run and step objects as it found them in the
        database only if they are put back as they were before it (it may have
        set fields before failing).
        """
        if connection.in_atomic_block:  # a quick stretch: its transaction is not retried, so no copies
            return record()
        objects = [self.run, *self.step_runs.values()]
        saved = [(obj, {**obj.__dict__, "_state": copy.copy(obj._state)}) for obj in objects]
        keys = dict(self.step_runs)

        def restore() -> None:
            for obj, fields in saved:
                obj.__dict__.clear()
                obj.__dict__.update(fields)
            self.step_runs.clear()
            self.step_runs.update(keys)

        return transient.with_retries(
            record, f"run {self.run.pk}: recording an outcome", before_retry=restore
        )

    # --- the run's final writes in one round trip --------------------------------

    def keep_writes(self) -> None:
        """From now on, the run's final writes wait to go in one round trip (:meth:`_send_kept`).

        Only inside a transaction that holds the run's row (the claim's, ``Executor.begin``)
        and on PostgreSQL; the caller ends it with :meth:`_flush_run` before the commit.
        When that transaction is the caller's own (not a savepoint in someone else's), the
        run's end also carries its ``COMMIT``: one round trip fewer.
        """
        if connection.vendor == "postgresql":
            self._kept = []
            self._commit_with_end = len(connection.atomic_blocks) == 1

    def _end_run(self, fields: dict[str, Any]) -> Callable[[], None]:
        """The run's final UPDATE: at once, or kept for :meth:`_send_kept`, fenced all the same.

        Returns what logs the change (:func:`log_change`) once a kept UPDATE was sent: the
        line is then written after the run's end reached the database, not on its way there."""
        if self._kept is None:
            self._update_run(**fields)
            return _nothing
        check_transition(self.run.status, fields["status"])
        fields = {**self._pending, **fields}
        self._pending = {}
        self._kept.append((self._run_update(fields), None))
        error = fields.get("error") or {}
        logged = partial(log_change, self.run.pk, fields["status"], old=self.run.status,
                         detail=f"{error.get('code', '')} {error.get('message', '')}".strip()[:200])  # fmt: skip
        for name, value in fields.items():
            setattr(self.run, name, value)
        return logged

    def _run_update(self, fields: dict[str, Any]) -> one_round_trip.Statement:
        """The fenced UPDATE, made to stop the query it is sent in when its fence misses.

        The statement ``Run.objects.filter(pk=…, claimed_by=…, status=…).update(**fields)``
        sends, written without building and compiling a query each time (the values
        adapted as the ORM's compiler adapts them: ``get_db_prep_save``)."""
        sql = _RUN_UPDATES.get(tuple(fields))
        if sql is None:
            quote = connection.ops.quote_name
            columns = ", ".join(f"{quote(Run._meta.get_field(name).column)} = %s" for name in fields)
            sql = _RUN_UPDATES[tuple(fields)] = (
                f"UPDATE {quote(Run._meta.db_table)} SET {columns}"  # noqa: S608 - names from the model
                f" WHERE {quote('id')} = %s AND {quote('claimed_by')} = %s AND {quote('status')} = %s"
            )
        params = [
            Run._meta.get_field(name).get_db_prep_save(value, connection) for name, value in fields.items()
        ]
        params += [Run._meta.pk.get_db_prep_value(self.run.pk, connection), self.me, self.run.status]
        return one_round_trip.one_row((sql, params))

    def _send_kept(self, *, last: bool = False) -> None:
        """Send the writes kept back, the run's pending fields, the new step rows and the audit
        entries so far in one round trip. A fence that misses stops the query there, and the
        whole transaction (the claim too) rolls back. ``last``: nothing follows in this
        transaction (the run's end): its COMMIT goes in the same query when it may."""
        if not self._kept and not (self._kept is not None and self._pending):
            return
        assert self._kept is not None
        kept, self._kept = self._kept, []
        if self._pending:
            kept.append((self._run_update(self._pending), None))
            self._pending = {}
        rows = self._unsaved_steps
        if rows:
            self._unsaved_steps = []

            def saved(result: one_round_trip.Result) -> None:
                for row, (pk,) in zip(rows, result[1] or (), strict=True):
                    row.pk = pk
                    one_round_trip.mark_saved(row, connection.alias)

            kept.append((one_round_trip.insert_many(rows, using=connection.alias), saved))
        audit = writer.batch_statement()
        if audit is not None:
            kept.append((audit, None))
        try:
            results = one_round_trip.send([statement for statement, _ in kept], using=connection.alias,
                                          commit=last and self._commit_with_end)  # fmt: skip
        except one_round_trip.FenceMissed:
            transaction.set_rollback(True)  # what ran before the miss must not commit
            raise LostClaim(str(self.run.pk)) from None
        for (_, check), result in zip(kept, results, strict=True):
            if check is not None:
                check(result)

    # --- outcomes ------------------------------------------------------------

    def _store_outcome(self, step_run, step, attempt, config, envelope: Envelope, *, started=False,
                       started_at=None, bind_output=True, status=StepStatus.SUCCEEDED) -> None:  # fmt: skip
        step_id = step["step_id"]
        now = timezone.now()
        with transaction.atomic(savepoint=False):
            self._save_step(
                step_run, status=status, attempt=attempt, rendered_config=config, output=envelope.as_dict(),
                error_code="", error_message="", cost_usd=step_run.cost_usd + envelope.cost_usd, checkpoint=None,
                started_at=started_at or now,
                finished_at=None if status == StepStatus.WAITING else now,
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
            verb = "is waiting" if status == StepStatus.WAITING else "succeeded"
            instruments.step_outcome(action=step["action"], outcome=status, started_at=step_run.started_at,
                                     finished_at=step_run.finished_at)  # fmt: skip
            self._audit(f"step.{status}", f"{step_id} {verb}" + (f": {envelope.summary}" if envelope.summary else ""),
                        Outcome.SUCCESS, refs={"step": step_id}, payload=spent(envelope))  # fmt: skip

    def _skip(self, step_run: StepRun, step: dict) -> None:
        with transaction.atomic(savepoint=False):
            now = timezone.now()
            self._save_step(step_run, status=StepStatus.SKIPPED, started_at=now, finished_at=now)
            instruments.step_outcome(action=step["action"], outcome=StepStatus.SKIPPED)
            self._update_run(step_index=self.run.step_index + 1)
            self._audit(
                "step.skipped", f"{step['step_id']} skipped: 'when' was false", refs={"step": step["step_id"]}
            )

    def _park_mid_step(self, step_run, step, attempt, config, state, meter: CostMeter, started: bool,
                       started_at) -> Parked:  # fmt: skip
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
        self._store_outcome(
            step_run, step, attempt, config, envelope, started=started, status=StepStatus.WAITING
        )
        with transaction.atomic(savepoint=False):
            self._update_run(status=RunStatus.WAITING, wake_at=wake_at, claimed_by="", lease_expires_at=None)
            self._audit("run.waiting", f"waiting until {wake_at.isoformat()}", refs={"step": step["step_id"]})
        run_wake_at(self.run, wake_at)
        return Parked(RunStatus.WAITING, wake_at)

    def _interrupted(self, step_run, step, attempt, config, envelope: Envelope) -> Parked:
        """An operator cancelled the run while this step's handler ran: say what was interrupted."""
        step_id = step["step_id"]
        what = (envelope.error or {}).get("message") or envelope.summary or "the step was interrupted"
        with transaction.atomic(savepoint=False):
            self._save_step(step_run, status=StepStatus.CANCELLED, attempt=attempt, rendered_config=config,
                            output=envelope.as_dict(), error_code=ErrorCode.CANCELLED, error_message=what[:500],
                            finished_at=timezone.now())  # fmt: skip
            instruments.step_outcome(action=step["action"], outcome=StepStatus.CANCELLED,
                                     started_at=step_run.started_at, finished_at=step_run.finished_at)  # fmt: skip
            self._audit("step.cancelled", f"{step_id} interrupted by a cancel: {what}", Outcome.FAILURE,
                        refs={"step": step_id}, payload={"action": step["action"], "interrupted": what})  # fmt: skip
        self._finish(RunStatus.CANCELLED, error={"code": ErrorCode.CANCELLED, "message": "cancelled by an operator",
                                                 "step_id": step_id, "interrupted": what})  # fmt: skip
        return Parked(RunStatus.CANCELLED)

    def _step_failed(self, step_run, step, attempt, envelope: Envelope, config=None, started=False,
                     started_at=None) -> Parked | None:  # fmt: skip
        step_id = step["step_id"]
        error = envelope.error or {"code": ErrorCode.INTERNAL, "message": "failed", "retryable": False}
        max_retries = int(step.get("max_retries", self.execution.get("max_retries", 0)))
        now = timezone.now()
        retry = bool(error.get("retryable")) and attempt <= max_retries
        with transaction.atomic(savepoint=False):
            self._save_step(
                step_run, status=StepStatus.PENDING if retry else StepStatus.FAILED, attempt=attempt,
                rendered_config=config, output=envelope.as_dict(), error_code=error["code"],
                error_message=error["message"][:500], started_at=started_at or now, finished_at=now,
                cost_usd=step_run.cost_usd + envelope.cost_usd, checkpoint=None,
                idempotency_key="" if definite_failure(envelope) else step_run.idempotency_key,
            )  # fmt: skip
            if envelope.cost_usd:
                self._update_run(cost_usd=Decimal(self.run.cost_usd) + envelope.cost_usd)
            instruments.step_outcome(action=step["action"], outcome="retrying" if retry else StepStatus.FAILED,
                                     started_at=started_at, finished_at=now)  # fmt: skip
            if not started:
                self._audit("step.started", f"{step_id} started (attempt {attempt})", refs={"step": step_id},
                            payload={"action": step["action"]})  # fmt: skip
            if retry:
                kind = step.get("retry_backoff", self.execution.get("retry_backoff", "exponential"))
                delay = backoff_seconds(kind, attempt)
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
                        payload={"error": error, "attempt": attempt, **spent(envelope)})  # fmt: skip
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
            logged = self._end_run({"status": status, "output": output, "error": error,
                                    "finished_at": timezone.now(), "claimed_by": "", "lease_expires_at": None})  # fmt: skip
            if status != RunStatus.SUCCEEDED:
                skip_unreached(
                    self.run, status, {index for (phase, index) in self.step_runs if phase == PLAN}
                )
            outcome = Outcome.SUCCESS if status == RunStatus.SUCCEEDED else Outcome.FAILURE
            detail = f": {error['code']}" if error else ""
            self._audit(f"run.{status}", f"run {status}{detail}", outcome,
                        payload={"error": error, "cost_usd": str(self.run.cost_usd)})  # fmt: skip
            if status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT):
                kind = "succeeded" if status == RunStatus.SUCCEEDED else "failed"
                event = {
                    "workspace_id": self.run.workspace_id, "event_type": f"automation.run.{kind}",
                    "source": f"automation:{self.run.automation_id}", "trace_id": self.run.trace_id,
                    "chain_depth": self.run.chain_depth + 1, "parent_run_id": str(self.run.pk),
                    "principal_ids": self.run.principal_ids,
                    "payload": {"automation_id": str(self.run.automation_id),
                                "automation_name": self.run.snapshot.get("name"), "run_id": str(self.run.pk),
                                "status": status, "output": output, "error": error},
                }  # fmt: skip
                if self._kept is None:
                    events.publish(**event)
                else:  # its subscriber check is part of its INSERT, sent with the run's other final writes
                    self._kept.append(events.publish_statement(**event))
            self._send_kept(last=True)
        # Once the run's end was sent (with its COMMIT, when it carries it): not on its way.
        logged()
        instruments.run_finished(status=status, queue=self.run.queue, created_at=self.run.created_at,
                                 finished_at=self.run.finished_at)  # fmt: skip
        run_settled(self.run)


def _nothing() -> None:
    pass


def backoff_seconds(kind: str, attempt: int) -> float:
    base = float(settings.AUTOPLANE_RETRY_BASE_SECONDS)
    delay = 0.0 if kind == "none" else base * attempt if kind == "linear" else base * (2 ** (attempt - 1))
    return min(delay, MAX_BACKOFF_SECONDS) * random.uniform(0.8, 1.2)  # jitter spreads retries  # noqa: S311


def redacted(envelope: Envelope, secrets: list[str]) -> Envelope:
    if not secrets:
        return envelope
    envelope.data = redact(envelope.data, secrets)
    envelope.summary = redact(envelope.summary, secrets)
    if envelope.error:
        envelope.error = redact(envelope.error, secrets)
    return envelope


def spent(envelope: Envelope) -> dict[str, Any]:
    """What a step cost, for its audit row (tokens only when it used some)."""
    return {"cost_usd": str(envelope.cost_usd), **({"usage": envelope.usage} if envelope.usage else {})}


def charged(envelope: Envelope, meter: CostMeter) -> Envelope:
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
