"""Runs driven through the real executor: outputs, skips, retries, failures, budgets,
cancel, concurrency policies, re-run and resolve — each proven by behaviour."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from audit.models import AuditEvent
from automations import enqueue, executor, services
from automations.models import Run, RunStatus, StepRun
from config.celery import app as celery_app
from config.celery import queue_backlog
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db


def create(workspace, *steps, **extra):
    return services.automation_create(workspace=workspace, definition=definition(*steps, **extra))


def start(automation, inputs=None):
    result = services.run_create(automation=automation, inputs=inputs or {})
    return result.run


def post(step_id, url, **extra):
    return {"step_id": step_id, "action": "http_request", "config": {"method": "POST", "url": url}, **extra}


def trace_types(run):
    return list(
        AuditEvent.objects.filter(trace_id=run.trace_id).order_by("id").values_list("type", flat=True)
    )


def test_outputs_chain_and_when_skips(workspace, drive, api):
    automation = create(
        workspace,
        transform("a", {"items": "{{ inputs.items }}"}, output_as="a"),
        transform("b", "never", when="{{ a.items | length > 5 }}"),
        transform("c", {"count": "{{ a.items | length }}", "first": "{{ a.items | first }}"}, output_as="c"),
        inputs={
            "schema": {"type": "object", "properties": {"items": {"type": "array"}}, "required": ["items"]}
        },
    )
    run = drive(start(automation, {"items": [3, 1, 2]}).pk)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == {"count": 3, "first": 3}
    body = api.get(f"/api/v1/runs/{run.pk}").json()
    assert [(s["step_id"], s["status"]) for s in body["steps"]] == [
        ("a", "succeeded"), ("b", "skipped"), ("c", "succeeded")]  # fmt: skip
    assert body["steps"][0]["output"]["data"] == {"items": [3, 1, 2]}
    assert body["trace_id"] == run.trace_id
    assert body["finished_at"]
    assert body["started_at"]
    assert trace_types(run) == [
        "run.created", "run.started", "step.started", "step.succeeded", "step.skipped", "step.started",
        "step.succeeded", "run.succeeded", "event.published",
    ]  # fmt: skip


def test_inputs_are_validated_before_a_run_exists(workspace, api):
    automation = create(
        workspace, transform("a", 1),
        inputs={"schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
    )  # fmt: skip
    response = api.post(f"/api/v1/automations/{automation.pk}/run", {"n": "three"}, format="json")
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/inputs/n"
    assert Run.objects.count() == 0


def test_retryable_failure_is_retried_with_backoff_then_succeeds(workspace, drive, http_server):
    http_server.statuses = [503, 503]
    automation = create(workspace, post("call", http_server.url + "/flaky", max_retries=3, retry_backoff="linear"),
                        execution={"autonomy": "A4"})  # fmt: skip
    run = start(automation)
    executor.execute_run(str(run.pk))
    parked = Run.objects.get(pk=run.pk)
    assert parked.status == RunStatus.WAITING
    assert parked.wake_at > timezone.now() + timedelta(seconds=1)  # linear backoff, base 2 s, jittered
    assert executor.execute_run(str(run.pk)) is None or Run.objects.get(pk=run.pk).status == RunStatus.WAITING
    run = drive(run.pk)
    assert run.status == RunStatus.SUCCEEDED
    step = StepRun.objects.get(run=run)
    assert step.attempt == 3
    assert len(http_server.requests) == 3
    keys = {r["headers"]["Idempotency-Key"] for r in http_server.requests}
    assert len(keys) == 1  # a 503 was not processed: the retries are the same call, with the same key
    assert trace_types(run).count("step.retrying") == 2


def test_retries_exhausted_fail_the_run_and_run_on_failure(workspace, drive, http_server):
    http_server.statuses = [500, 500, 500]
    automation = create(
        workspace, post("call", http_server.url + "/down", max_retries=1, retry_backoff="none"),
        execution={"autonomy": "A4", "on_failure": [
            {"step_id": "note", "action": "transform_data",
             "config": {"output": "{{ run.failed_step_id }}: {{ run.error.code }}"}}]},
    )  # fmt: skip
    run = drive(start(automation).pk)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "TEMPORARILY_UNAVAILABLE"
    assert run.error["step_id"] == "call"
    note = StepRun.objects.get(run=run, phase="on_failure")
    assert note.status == "succeeded"
    assert note.output["data"] == "call: TEMPORARILY_UNAVAILABLE"
    assert len(http_server.requests) == 2
    assert "run.on_failure" in trace_types(run)
    assert trace_types(run)[-2] == "run.failed"


def test_client_error_is_not_retried(workspace, drive, http_server):
    http_server.statuses = [404]
    automation = create(workspace, post("call", http_server.url + "/missing", max_retries=3),
                        execution={"autonomy": "A4"})  # fmt: skip
    run = drive(start(automation).pk)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "INVALID_ARGUMENT"
    assert len(http_server.requests) == 1


def test_template_failure_at_run_time_is_a_template_error(workspace, drive):
    automation = create(workspace, transform("a", "{{ inputs.missing.deeper }}"))
    run = drive(start(automation).pk)
    assert run.status == RunStatus.FAILED
    assert run.error["code"] == "TEMPLATE_ERROR"
    assert "Traceback" not in run.error["message"]


def test_run_timeout_marks_timed_out(workspace, drive):
    automation = create(workspace, transform("a", 1), transform("b", 2), execution={"timeout_seconds": 5})
    run = start(automation)
    executor.claim(str(run.pk), "test:1")  # started, then the clock runs past the deadline
    Run.objects.filter(pk=run.pk).update(
        started_at=timezone.now() - timedelta(seconds=60),
        claimed_by="", lease_expires_at=timezone.now() - timedelta(seconds=1),
    )  # fmt: skip
    run = drive(run.pk)
    assert run.status == RunStatus.TIMED_OUT
    assert run.error["code"] == "TIMEOUT"
    assert not StepRun.objects.filter(run=run, status="succeeded").exists()


def test_a_step_that_costs_nothing_fits_any_budget_cap(workspace, api):
    # The refusal when an estimate exceeds the cap: tests/llm/test_agent_task.py.
    automation = create(workspace, transform("a", 1), execution={"budget_cap_usd": 0})
    response = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    assert response.status_code == 202


def test_cancel_between_steps(workspace, drive, api):
    automation = create(workspace, transform("a", 1), transform("b", 2))
    run = start(automation)
    assert api.post(f"/api/v1/runs/{run.pk}/cancel").status_code == 200
    run = drive(run.pk)
    assert run.status == RunStatus.CANCELLED
    assert not StepRun.objects.filter(run=run, status="succeeded").exists()
    assert api.post(f"/api/v1/runs/{run.pk}/cancel").json()["error"]["code"] == "CONFLICT"


def test_cancel_of_a_running_run_stops_at_the_next_step(workspace, drive):
    automation = create(workspace, transform("a", 1), transform("b", 2))
    run = start(automation)
    executor.claim(str(run.pk), "other-host:1")
    services.run_cancel(run=run)
    assert Run.objects.get(pk=run.pk).cancel_requested
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    run = drive(run.pk)
    assert run.status == RunStatus.CANCELLED


def test_drop_if_running_suppresses_and_audits(workspace, api):
    automation = create(workspace, transform("a", 1), execution={"concurrency": "drop_if_running"})
    first = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    assert first.status_code == 202
    second = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    assert second.status_code == 200
    assert second.json() == {"run_id": None, "suppressed": True, "reason": "drop_if_running"}
    assert Run.objects.count() == 1
    assert AuditEvent.objects.filter(type="run.suppressed", outcome="suppressed").count() == 1


def test_queue_policy_runs_strictly_in_arrival_order(workspace, drive):
    automation = create(workspace, transform("a", "{{ inputs.n }}"), execution={"concurrency": "queue"},
                        inputs={"schema": {"type": "object"}})  # fmt: skip
    runs = [start(automation, {"n": i}) for i in range(3)]
    assert [r.enqueued_at is not None for r in runs] == [True, False, False]
    finished = []
    for _ in range(3):
        ready = Run.objects.filter(status=RunStatus.QUEUED, enqueued_at__isnull=False).order_by("created_at")
        assert ready.count() == 1  # only one at a time
        finished.append(drive(ready.first().pk).output)
    assert finished == [0, 1, 2]


def test_concurrency_key_serialises_per_customer_only(workspace):
    automation = create(
        workspace, transform("a", 1),
        execution={"concurrency": "queue", "concurrency_key": "{{ inputs.customer }}"},
        inputs={"schema": {"type": "object", "properties": {"customer": {"type": "string"}}}},
    )  # fmt: skip
    a1, a2, b1 = (
        start(automation, {"customer": "a"}),
        start(automation, {"customer": "a"}),
        start(automation, {"customer": "b"}),
    )
    assert (a1.enqueued_at is not None, a2.enqueued_at is not None, b1.enqueued_at is not None) == (
        True,
        False,
        True,
    )
    assert a2.concurrency_key == "a"


def test_allow_parallel_with_max_concurrent(workspace):
    automation = create(
        workspace, transform("a", 1), execution={"concurrency": "allow_parallel", "max_concurrent": 2}
    )
    runs = [start(automation) for _ in range(3)]
    assert [r.enqueued_at is not None for r in runs] == [True, True, False]


def test_rerun_from_step_reuses_earlier_outputs(workspace, drive, api):
    automation = create(workspace, transform("a", "{{ inputs.x }}", output_as="a"),
                        transform("b", "{{ a }}-b", output_as="b"), inputs={"schema": {"type": "object"}})  # fmt: skip
    original = drive(start(automation, {"x": "one"}).pk)
    response = api.post(f"/api/v1/runs/{original.pk}/rerun", {"from_step": "b"}, format="json")
    assert response.status_code == 202
    rerun = drive(response.json()["run_id"])
    assert rerun.status == RunStatus.SUCCEEDED
    assert rerun.output == "one-b"
    assert rerun.parent_run_id == original.pk
    assert (
        StepRun.objects.get(run=rerun, step_id="a").started_at
        == StepRun.objects.get(run=original, step_id="a").started_at
    )
    bad = api.post(f"/api/v1/runs/{original.pk}/rerun", {"from_step": "zzz"}, format="json")
    assert bad.status_code == 400


def test_idempotency_key_on_manual_run(workspace, api):
    automation = create(workspace, transform("a", 1), inputs={"schema": {"type": "object"}})
    url = f"/api/v1/automations/{automation.pk}/run"
    first = api.post(url, {"x": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = api.post(url, {"x": 1}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    other = api.post(url, {"x": 2}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 202
    assert again.status_code == 200
    assert again.json()["run_id"] == first.json()["run_id"]
    assert other.status_code == 422
    assert Run.objects.count() == 1


def test_illegal_transition_is_refused():
    from automations.transitions import IllegalTransition, check_transition

    with pytest.raises(IllegalTransition):
        check_transition("succeeded", "running")
    with pytest.raises(IllegalTransition):
        check_transition("queued", "succeeded")
    check_transition("awaiting_approval", "queued")


def test_wait_parks_without_holding_a_worker(workspace, drive):
    automation = create(workspace, {"step_id": "pause", "action": "wait", "config": {"seconds": 3600}},
                        transform("after", "done"))  # fmt: skip
    run = start(automation)
    executor.execute_run(str(run.pk))
    parked = Run.objects.get(pk=run.pk)
    assert parked.status == RunStatus.WAITING
    assert parked.claimed_by == ""
    assert parked.wake_at > timezone.now() + timedelta(minutes=59)
    assert executor.execute_run(str(run.pk)) is None  # not due: a redelivered message does nothing
    run = drive(run.pk)
    assert run.status == RunStatus.SUCCEEDED
    assert run.output == "done"


def test_a_run_cancelled_while_queued_or_waiting_skips_the_steps_it_never_reached(workspace, drive):
    def steps(run):
        return [(s.step_id, s.status, s.error_message)
                for s in StepRun.objects.filter(run=run, phase="plan").order_by("index")]  # fmt: skip

    skipped = "not run: the run cancelled before this step"
    queued = start(create(workspace, transform("a", 1), transform("b", 2)))
    services.run_cancel(run=queued)
    assert steps(queued) == [("a", "skipped", skipped), ("b", "skipped", skipped)]

    automation = create(workspace, transform("first", 0), {"step_id": "pause", "action": "wait",
                        "config": {"seconds": 3600}}, transform("after", "done"))  # fmt: skip
    waiting = start(automation)
    executor.execute_run(str(waiting.pk))
    assert Run.objects.get(pk=waiting.pk).status == RunStatus.WAITING
    services.run_cancel(run=waiting)
    assert [(step, status) for step, status, _ in steps(waiting)] == [
        ("first", "succeeded"),
        ("pause", "cancelled"),
        ("after", "skipped"),
    ]
    assert drive(waiting.pk).status == RunStatus.CANCELLED
    assert StepRun.objects.filter(run=waiting).count() == 3  # a late message adds no row


def test_sweeper_requeues_runs_whose_worker_died(workspace, settings):
    automation = create(workspace, transform("a", 1))
    run = start(automation)
    executor.claim(str(run.pk), "gone-host:4242")
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    counts = services.runs_sweep()
    assert counts["lease_expired"] == 1


def test_cancelling_a_run_awaiting_approval_closes_its_approval(workspace, drive):
    from approvals.models import Approval

    automation = create(
        workspace, {"step_id": "ask", "action": "require_approval", "config": {"message": "ok?"}}
    )
    run = drive(start(automation).pk)
    assert run.status == RunStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.status == "pending"
    assert approval.why == "explicit approval step"
    services.run_cancel(run=run)
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
    assert Approval.objects.get(pk=approval.pk).status == "invalidated"


@pytest.mark.django_db(transaction=True)
def test_a_step_without_side_effects_longer_than_the_lease_keeps_its_run(workspace, http_server, settings):
    settings.AUTOPLANE_RUN_LEASE_SECONDS = 1
    http_server.block = threading.Event()
    get = {"step_id": "slow", "action": "http_request", "config": {"method": "GET", "url": http_server.url}}
    run = start(create(workspace, get))
    outcome: dict = {}

    def work():
        try:
            outcome["status"] = executor.execute_run(str(run.pk), "worker-1:1")
        finally:
            connection.close()

    thread = threading.Thread(target=work)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not http_server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)  # past the 1 s lease: only a renewal (or a lease covering the step) keeps it
        assert Run.objects.get(pk=run.pk).lease_expires_at > timezone.now()
        assert executor.claim(str(run.pk), "worker-2:2") is None, "a live worker was robbed"
        assert services.runs_sweep()["lease_expired"] == 0
    finally:
        http_server.block.set()
        thread.join(30)

    assert outcome["status"] == RunStatus.SUCCEEDED
    assert len(http_server.requests) == 1


# --- accepted means durable: the outbox and its relay ------------------------------------------------


def test_a_run_whose_publish_fails_after_commit_is_accepted_and_left_to_the_relay(
    workspace, api, monkeypatch, django_capture_on_commit_callbacks
):
    automation = create(workspace, transform("a", "x"))

    def broker_down(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(celery_app, "send_task", broker_down)
    monkeypatch.setattr(enqueue, "_redis_publish", lambda: None)  # by send_task (config.redis_publish: below)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")

    assert response.status_code == 202, response.content
    assert len(callbacks) == 1  # the publish was attempted, and failed
    assert Run.objects.get(pk=response.json()["run_id"]).status == RunStatus.QUEUED


def test_the_relay_publishes_queued_runs_only_when_their_queue_holds_no_message(workspace, settings):
    settings.AUTOPLANE_RELAY_AFTER_SECONDS = 0
    queue = f"relay_test_{uuid.uuid4().hex[:8]}"  # a queue of its own: others' messages do not count
    automation = create(workspace, transform("a", "x"))
    lost = start(automation)
    Run.objects.filter(pk=lost.pk).update(queue=queue, enqueued_at=timezone.now() - timedelta(seconds=1))
    try:
        assert enqueue.runs_relay() == 1
        assert queue_backlog((queue,))[queue] == 1
        stamped = Run.objects.get(pk=lost.pk).enqueued_at

        # Its message is in the queue now: the relay leaves the run alone.
        Run.objects.filter(pk=lost.pk).update(enqueued_at=stamped - timedelta(seconds=1))
        assert enqueue.runs_relay() == 0
        assert queue_backlog((queue,))[queue] == 1
    finally:
        with celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)


def test_a_retry_after_a_definite_failure_is_a_new_call_with_a_new_key(workspace, drive, http_server):
    http_server.statuses = [500]  # processed and failed: a receiver may store and replay it per key
    automation = create(workspace, post("call", http_server.url + "/once", max_retries=1, retry_backoff="none"),
                        execution={"autonomy": "A4"})  # fmt: skip
    run = drive(start(automation).pk)

    assert run.status == RunStatus.SUCCEEDED
    keys = [r["headers"]["Idempotency-Key"] for r in http_server.requests]
    assert len(keys) == 2
    assert keys[0] != keys[1]


def test_a_retry_safe_call_recovered_after_its_worker_died_keeps_its_key(workspace, drive, http_server):
    put = {
        "step_id": "put",
        "action": "http_request",
        "config": {"method": "PUT", "url": http_server.url + "/x"},
    }
    automation = create(workspace, put, execution={"autonomy": "A4"})
    run = start(automation)
    # What a worker killed mid-call leaves behind: the step checkpointed running, with its key.
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, claimed_by="gone:1", started_at=timezone.now(),
                                         lease_expires_at=timezone.now() - timedelta(seconds=1))  # fmt: skip
    StepRun.objects.create(run=run, phase="plan", index=0, step_id="put", action="http_request", status="running",
                           attempt=1, idempotency_key="k" * 64, started_at=timezone.now())  # fmt: skip

    run = drive(run.pk)

    assert run.status == RunStatus.SUCCEEDED
    assert [r["headers"]["Idempotency-Key"] for r in http_server.requests] == ["k" * 64]
