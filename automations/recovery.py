"""Recovery (SPEC §7.2): what a claim does with a step a dead worker left ``running``.

A claim that finds the run's current step ``running`` with no outcome knows the
previous worker died mid-call. A step safe to retry gets a new attempt; any
other becomes ``OUTCOME_UNKNOWN`` and the run ``needs_attention`` for an
operator — never a guessed success. A run whose workers keep dying (a step that
kills its worker, again and again) is recovered at most
``AUTOPLANE_MAX_RECOVERIES`` times, then its step fails ``RECOVERY_LIMIT``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from audit.models import Outcome
from capabilities.base import Envelope, ErrorCode
from config import instruments

from . import definition as defs
from . import steps
from .concurrency import run_settled
from .models import FINAL_RUN_STATUSES, RunStatus, StepRun, StepStatus
from .outcomes import RunRecorder

UNKNOWN_OUTCOME = "the worker stopped during this step; whether its side effect happened is unknown"


def recover(recorder: RunRecorder) -> bool:
    """Decide what to do with the current step if a dead worker left it ``running``. False = stop here."""
    run = recorder.run
    step_run = recorder.step_runs.get((run.phase, run.step_index))
    if step_run is None or step_run.status != StepStatus.RUNNING:
        return True
    step = steps.steps_of(run, run.phase)[run.step_index]
    capability = defs.describe_step({**step, "config": step_run.rendered_config or step.get("config") or {}},
                                    run.workspace_id)  # fmt: skip
    step_id = step["step_id"]
    if capability is None or not capability.safe_to_retry:
        with transaction.atomic(savepoint=False):
            error = _fail_step(recorder, step_run, ErrorCode.OUTCOME_UNKNOWN, UNKNOWN_OUTCOME)
            instruments.run_recovered(outcome="needs_attention")
            instruments.step_outcome(action=step["action"], outcome="outcome_unknown")
            recorder._update_run(status=RunStatus.NEEDS_ATTENTION, error=error, claimed_by="",
                                 lease_expires_at=None)  # fmt: skip
            recorder._audit("step.outcome_unknown", f"{step_id}: {UNKNOWN_OUTCOME}", Outcome.FAILURE,
                            refs={"step": step_id}, payload={"idempotency_key": step_run.idempotency_key})  # fmt: skip
            recorder._audit(
                "run.needs_attention", "run needs an operator to resolve an unknown outcome", Outcome.FAILURE
            )
        run_settled(run)
        return False
    limit = settings.AUTOPLANE_MAX_RECOVERIES
    # Only a step left ``running`` counts against the limit: a takeover between steps
    # cannot be the run's fault, and a run failed into its ``on_failure`` steps keeps running them.
    if run.recoveries > limit:
        message = (f"the run's worker stopped {run.recoveries} times while running it; "
                   f"it was recovered {limit} times and is not recovered again")  # fmt: skip
        with transaction.atomic(savepoint=False):
            error = _fail_step(recorder, step_run, ErrorCode.RECOVERY_LIMIT, message)
            recorder._audit("run.recovery_limit", f"{step_id}: {message}", Outcome.FAILURE, refs={"step": step_id},
                            payload={"recoveries": run.recoveries, "max_recoveries": limit,
                                     "attempt": step_run.attempt})  # fmt: skip
        recorder._fail(error)
        return run.status not in FINAL_RUN_STATUSES  # on_failure steps may still run
    with transaction.atomic(savepoint=False):
        recorder._save_step(step_run, status=StepStatus.PENDING)
        instruments.run_recovered(outcome="retried")
        instruments.step_outcome(action=step["action"], outcome="recovered")
        recorder._audit("step.recovered", f"{step_id}: worker lost mid-step; safe to retry",
                        refs={"step": step_id}, payload={"attempt": step_run.attempt})  # fmt: skip
    return True


def _fail_step(recorder: RunRecorder, step_run: StepRun, code: str, message: str) -> dict[str, str]:
    """Record the step as failed with ``code``; returns the run's error for it."""
    recorder._save_step(
        step_run, status=StepStatus.FAILED, error_code=code, error_message=message, finished_at=timezone.now(),
        output=Envelope.failure(code, message, retryable=False).as_dict(),
    )  # fmt: skip
    return {"code": code, "message": message, "step_id": step_run.step_id}
