"""Faults the executor lives through (issue 18): database connections killed under it,
poison runs that kill their worker again and again, a sweep that re-sends a run once
per lease expiry. The real executor, a real database, a local server counting calls."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from audit.models import AuditEvent
from audit.verify import verify_chain
from automations import executor, services
from automations.action_context import action_context
from automations.models import Run, RunStatus, StepRun
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="pg_terminate_backend: the PostgreSQL lane"
)


def start(workspace, *steps, **extra):
    automation = services.automation_create(workspace=workspace, definition=definition(*steps, **extra))
    return services.run_create(automation=automation, inputs={}).run


def put(url):
    return {"step_id": "put", "action": "http_request", "config": {"method": "PUT", "url": url}}


def post(url):
    return {"step_id": "post", "action": "http_request", "config": {"method": "POST", "url": url}}


def kill_other_connections() -> int:
    """pg_terminate_backend on every other connection to the test database (the worker's, its lease's)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def audit_types(run) -> list[str]:
    return list(
        AuditEvent.objects.filter(trace_id=run.trace_id).order_by("id").values_list("type", flat=True)
    )


# --- transient database errors are retried, not acked away ---------------------------------------


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_claim_on_a_killed_connection_reconnects_and_runs(workspace):
    run = start(workspace, transform("a", "x"))
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")  # this worker's own connection

    assert executor.execute_run(str(run.pk), "worker-1:1") == RunStatus.SUCCEEDED
    run.refresh_from_db()
    assert (run.status, run.output, run.recoveries) == (RunStatus.SUCCEEDED, "x", 0)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_connections_killed_mid_call_lose_no_outcome_and_repeat_no_call(workspace, http_server):
    """The worker's connections die while its POST is in flight: the answer is recorded once
    the worker has reconnected, the POST is not sent again, and the run goes on."""
    http_server.block = threading.Event()
    workspace.refresh_from_db()
    run = start(workspace, post(http_server.url + "/once"), transform("after", "done"),
                execution={"autonomy": "A4"})  # fmt: skip
    outcome: dict = {}

    def worker():
        try:
            outcome["status"] = executor.execute_run(str(run.pk), "worker-1:1")
        finally:
            connection.close()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not http_server.requests and time.monotonic() < deadline:
            time.sleep(0.02)
        assert http_server.requests, "the call was never made"
        assert kill_other_connections() >= 1
    finally:
        http_server.block.set()
        thread.join(60)
    assert not thread.is_alive()

    run.refresh_from_db()
    assert outcome["status"] == RunStatus.SUCCEEDED
    assert (run.status, run.output, run.recoveries) == (RunStatus.SUCCEEDED, "done", 0)
    assert len(http_server.requests) == 1
    assert list(StepRun.objects.filter(run=run).order_by("index").values_list("status", "attempt")) == [
        ("succeeded", 1), ("succeeded", 1)]  # fmt: skip
    types = audit_types(run)
    assert types.count("step.succeeded") == 2
    assert types.count("run.succeeded") == 1
    assert verify_chain(f"ws-{workspace.pk}").ok


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_handler_cancel_check_on_a_killed_connection_reconnects(workspace):
    """A handler reads the cancel flag mid-call (http_request, before each hop): a blip is not a failed step."""
    run = start(workspace, transform("a", "x"))
    ctx = action_context(run, {"step_id": "a"}, 1, "k" * 64, 5.0)
    with pytest.raises(OperationalError), connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    assert ctx.cancel_requested() is False
    Run.objects.filter(pk=run.pk).update(cancel_requested=True)
    assert ctx.cancel_requested() is True


# --- poison runs end ---------------------------------------------------------------------------------


def left_mid_step_by_a_dead_worker(run, *, recoveries: int) -> None:
    """What a worker killed in the middle of the PUT leaves: the step running with its key, the lease out."""
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, claimed_by="gone-host:1", recoveries=recoveries,
                                         started_at=timezone.now(),
                                         lease_expires_at=timezone.now() - timedelta(seconds=1))  # fmt: skip
    StepRun.objects.update_or_create(
        run=run, phase="plan", index=0,
        defaults={"step_id": "put", "action": "http_request", "status": "running", "attempt": recoveries + 1,
                  "idempotency_key": "k" * 64, "started_at": timezone.now()},
    )  # fmt: skip


def test_a_run_is_recovered_up_to_the_limit_then_fails_with_recovery_limit(workspace, http_server, settings):
    settings.AUTOPLANE_MAX_RECOVERIES = 2
    run = start(workspace, put(http_server.url + "/x"), execution={"autonomy": "A4"})

    # Two deaths mid-step: each takeover is counted, and the PUT is re-sent (same key).
    for recoveries in (0, 1):
        left_mid_step_by_a_dead_worker(run, recoveries=recoveries)
        claimed = executor.claim(str(run.pk), "worker-1:1")
        assert claimed.recoveries == recoveries + 1
        Run.objects.filter(pk=run.pk).update(claimed_by="gone-host:1")  # ...and that worker died too

    # The third death: past the limit, the run fails instead of being recovered again.
    left_mid_step_by_a_dead_worker(run, recoveries=2)
    assert executor.execute_run(str(run.pk), "worker-1:1") == RunStatus.FAILED

    run.refresh_from_db()
    assert run.recoveries == 3
    assert run.error["code"] == "RECOVERY_LIMIT"
    assert run.error["step_id"] == "put"
    step = StepRun.objects.get(run=run, index=0)
    assert (step.status, step.error_code) == ("failed", "RECOVERY_LIMIT")
    assert http_server.requests == []  # not called again
    limit = AuditEvent.objects.get(trace_id=run.trace_id, type="run.recovery_limit")
    assert limit.payload["recoveries"] == 3
    assert limit.payload["max_recoveries"] == 2
    assert "stopped 3 times" in limit.summary
    assert "run.failed" in audit_types(run)


def test_a_recovery_within_the_limit_re_runs_the_step_with_its_key(workspace, http_server, settings):
    settings.AUTOPLANE_MAX_RECOVERIES = 2
    run = start(workspace, put(http_server.url + "/x"), execution={"autonomy": "A4"})
    left_mid_step_by_a_dead_worker(run, recoveries=1)

    assert executor.execute_run(str(run.pk), "worker-1:1") == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.pk).recoveries == 2
    assert [r["headers"]["Idempotency-Key"] for r in http_server.requests] == ["k" * 64]


def test_only_a_takeover_counts_as_a_recovery(workspace):
    run = start(workspace, transform("a", "x"))
    assert executor.claim(str(run.pk), "worker-1:1").recoveries == 0  # a queued run: a first claim
    assert executor.claim(str(run.pk), "worker-1:1", held=True).recoveries == 0  # taken back after a DB error
    assert executor.claim(str(run.pk), "worker-2:2") is None  # a live lease: not taken at all
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert executor.claim(str(run.pk), "worker-2:2").recoveries == 1


# --- the sweep re-sends a run once per lease expiry ---------------------------------------------------


def test_the_sweep_sends_an_expired_lease_once_and_again_only_after_requeue_after(workspace, settings):
    settings.AUTOPLANE_REQUEUE_AFTER_SECONDS = 60
    run = start(workspace, transform("a", "x"))
    executor.claim(str(run.pk), "gone-host:4242")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))

    assert services.runs_sweep()["lease_expired"] == 1
    released = Run.objects.get(pk=run.pk)
    assert (released.status, released.claimed_by) == (RunStatus.RUNNING, "")
    assert services.runs_sweep()["lease_expired"] == 0  # the next pass leaves it to that message
    assert services.runs_sweep()["lease_expired"] == 0

    # That message was lost too: sent again once REQUEUE_AFTER has passed.
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=61))
    assert services.runs_sweep()["lease_expired"] == 1
    assert services.runs_sweep()["lease_expired"] == 0

    # The re-sent message is claimed like any expired lease, and counted as a recovery.
    claimed = executor.claim(str(run.pk), "worker-1:1")
    assert (claimed.claimed_by, claimed.recoveries) == ("worker-1:1", 1)


def test_the_sweep_sends_a_due_timer_once_and_again_only_after_requeue_after(workspace, settings):
    settings.AUTOPLANE_REQUEUE_AFTER_SECONDS = 60
    run = start(workspace, transform("a", "x"))
    enqueued_at = Run.objects.get(pk=run.pk).enqueued_at
    fired = timezone.now() - timedelta(seconds=5)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING, wake_at=fired)

    assert services.runs_sweep()["due"] == 1
    assert services.runs_sweep()["due"] == 0  # the next passes leave it to that message
    assert services.runs_sweep()["due"] == 0
    assert Run.objects.get(pk=run.pk).enqueued_at == enqueued_at  # the queue-wait metric is not touched

    # That message was lost too: sent again once REQUEUE_AFTER has passed.
    Run.objects.filter(pk=run.pk).update(resent_at=timezone.now() - timedelta(seconds=61))
    assert services.runs_sweep()["due"] == 1
    assert services.runs_sweep()["due"] == 0

    # A later wait (the run went on and parked again) is sent at once: the marker is from the earlier one.
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        resent_at=now - timedelta(seconds=30), wake_at=now - timedelta(seconds=3)
    )
    assert services.runs_sweep()["due"] == 1
    assert services.runs_sweep()["due"] == 0

    claimed = executor.claim(str(run.pk), "worker-1:1")
    assert (claimed.status, claimed.recoveries) == (RunStatus.RUNNING, 0)


# --- an operator's resolution starts the recovery count again ------------------------------------------


@pytest.mark.parametrize("resolution", ["retry", "succeeded"])
def test_a_resolution_that_goes_on_starts_the_recovery_count_again(workspace, settings, resolution):
    settings.AUTOPLANE_MAX_RECOVERIES = 3
    run = start(workspace, transform("a", "x"), transform("b", "y"))
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION, recoveries=3)

    resolved = services.run_resolve(run=Run.objects.get(pk=run.pk), resolution=resolution, reason="checked")
    assert (resolved.status, resolved.recoveries) == (RunStatus.QUEUED, 0)

    # The next worker death is a first recovery, not past the limit.
    executor.claim(str(run.pk), "gone-host:4242")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert executor.execute_run(str(run.pk), "worker-1:1") == RunStatus.SUCCEEDED
    assert Run.objects.get(pk=run.pk).recoveries == 1


def test_a_run_resolved_as_failed_gets_skipped_rows_for_the_steps_it_never_reached(workspace):
    """As a failed or cancelled run's (transitions.skip_unreached): the history shows every plan step."""
    run = start(workspace, post("http://127.0.0.1:9/x"), transform("b", "y"), transform("c", "z"))
    # Its worker died in the POST (checkpointed running, no outcome); the next claim cannot know
    # whether the POST happened and hands the run to an operator.
    executor.claim(str(run.pk), "gone-host:4242")
    StepRun.objects.create(run=run, phase="plan", index=0, step_id="post", action="http_request",
                           status="running", attempt=1, idempotency_key="k", started_at=timezone.now())  # fmt: skip
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert executor.execute_run(str(run.pk), "worker-1:1") == RunStatus.NEEDS_ATTENTION

    resolved = services.run_resolve(run=Run.objects.get(pk=run.pk), resolution="failed", reason="checked")

    assert resolved.status == RunStatus.FAILED
    steps = {s.step_id: (s.status, s.error_code) for s in StepRun.objects.filter(run=run, phase="plan")}
    assert steps == {"post": ("failed", "OUTCOME_UNKNOWN"), "b": ("skipped", ""), "c": ("skipped", "")}
