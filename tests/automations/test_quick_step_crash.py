"""A quick step that kills its worker every time is stopped by the recovery limit (issue 11).

Quick steps (no side effects, milliseconds) run in one transaction with the claim and
are never marked ``running``: a worker killed in one leaves no trace in the database,
the claim rolled back with it, and the broker gives the message back. The redelivered
message is run step by step (each step checkpointed), so the next death is seen,
recovered and counted like any step's, and past ``AUTOPLANE_MAX_RECOVERIES`` the run
fails with RECOVERY_LIMIT instead of killing workers forever. A real worker; the step
is a test-only action whose handler kill -9s the pool process running it.

A step that kills the whole worker (a solo pool: the worker is the process running the
step) leaves its message with the dead worker; the relay or the sweep sends the run again
in a fresh message the broker never gave back. Those re-sends are careful too.
"""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from automations import enqueue, services
from automations.models import FINAL_RUN_STATUSES, Run, RunStatus, StepRun
from tests import tasks
from tests.factories import definition, transform
from tests.live import live_worker_env, wait_for

MAX_RECOVERIES = 2


@pytest.fixture
def crash_action():
    tasks.register_crash_action()
    yield
    tasks.unregister_crash_action()


def test_a_quick_step_that_kills_its_worker_every_time_ends_with_recovery_limit(
    worker_factory, workspace, crash_action
):
    worker = worker_factory(
        queues=["automations_fast"], concurrency=1,
        env=live_worker_env(AUTOPLANE_TEST_CRASH_ACTION="1", AUTOPLANE_MAX_RECOVERIES=str(MAX_RECOVERIES)),
    )  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition(
        transform("before", {"n": 1}), {"step_id": "crash", "action": "test_crash_worker", "config": {}}))  # fmt: skip
    run = services.run_create(automation=automation, inputs={}).run
    assert run.queue == "automations_fast"

    wait_for(lambda: Run.objects.get(pk=run.pk).status in FINAL_RUN_STATUSES, timeout=120,
             what=f"the poison run to end (worker log:\n{worker.log_tail()})")  # fmt: skip

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "RECOVERY_LIMIT"
    assert run.error["step_id"] == "crash"
    # The first death is in the quick stretch (nothing recorded); each later one is a counted recovery.
    assert run.recoveries == MAX_RECOVERIES + 1
    crash = StepRun.objects.get(run=run, step_id="crash")
    assert (crash.status, crash.error_code) == ("failed", "RECOVERY_LIMIT")
    assert crash.attempt == MAX_RECOVERIES + 1
    assert StepRun.objects.get(run=run, step_id="before").status == "succeeded"
    types = list(AuditEvent.objects.filter(trace_id=run.trace_id).values_list("type", flat=True))
    assert types.count("step.recovered") == MAX_RECOVERIES
    assert types.count("run.recovery_limit") == 1
    assert types.count("run.started") == 1
    assert worker.alive()  # the pool process died each time, never the worker


def test_a_quick_step_that_kills_the_whole_worker_every_time_ends_with_recovery_limit(
    worker_factory, workspace, crash_action, settings
):
    settings.AUTOPLANE_RELAY_AFTER_SECONDS = 0  # the relay below sends at once what its dead worker held
    # A step's lease is its timeout (1 s below) + AUTOPLANE_RUN_LEASE_SECONDS.
    env = live_worker_env(AUTOPLANE_TEST_CRASH_ACTION="1", AUTOPLANE_MAX_RECOVERIES=str(MAX_RECOVERIES),
                          AUTOPLANE_RUN_LEASE_SECONDS="2")  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition(
        transform("before", {"n": 1}), {"step_id": "crash", "action": "test_crash_worker", "config": {},
        "timeout_seconds": 1}))  # fmt: skip

    # One worker at a time, as a supervisor would restart them, each sent the run once it is
    # ready: the first by the fire, each later one by the relay (the run is queued again: its
    # claim rolled back with the quick stretch) or the sweep (the run's lease ran out). Each
    # dies in the step. Counted, not timed: without careful re-sends every worker dies the
    # same way and the run never ends.
    run, deaths = None, 0
    while True:
        worker = worker_factory(queues=["automations_fast"], pool="solo", env=env)
        if run is None:
            run = services.run_create(automation=automation, inputs={}).run
        else:
            wait_for(lambda: enqueue.runs_relay() or services.runs_sweep()["lease_expired"], timeout=60,
                     what="the relay or the sweep to send the run again")  # fmt: skip
        wait_for(lambda: not worker.alive() or run_status(run) in FINAL_RUN_STATUSES,  # noqa: B023
                 timeout=120, what=f"the worker to die or the run to end (worker log:\n{worker.log_tail()})")  # fmt: skip
        if worker.alive():
            break
        deaths += 1
        assert deaths <= MAX_RECOVERIES + 2, f"the run killed {deaths} workers and is still {run_status(run)}"

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert (run.error["code"], run.error["step_id"]) == ("RECOVERY_LIMIT", "crash")
    # The first death is in the quick stretch (nothing recorded); each later one is a counted recovery.
    assert deaths == MAX_RECOVERIES + 2
    assert run.recoveries == MAX_RECOVERIES + 1
    crash = StepRun.objects.get(run=run, step_id="crash")
    assert (crash.status, crash.error_code, crash.attempt) == ("failed", "RECOVERY_LIMIT", MAX_RECOVERIES + 1)
    assert StepRun.objects.get(run=run, step_id="before").status == "succeeded"
    types = list(AuditEvent.objects.filter(trace_id=run.trace_id).values_list("type", flat=True))
    assert types.count("step.recovered") == MAX_RECOVERIES
    assert types.count("run.recovery_limit") == 1
    assert types.count("run.started") == 1


def run_status(run: Run) -> str:
    return Run.objects.get(pk=run.pk).status
