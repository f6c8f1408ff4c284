"""The engine on real Celery worker processes: end to end, and crash safety with real kills."""

from __future__ import annotations

import os
import random
import threading

import pytest
from django.utils import timezone

from audit.models import AuditEvent
from audit.verify import verify_all
from automations import services
from automations.models import Run, RunStatus, StepRun
from tests.factories import client_for, definition, transform
from tests.live import wait_for

pytestmark = pytest.mark.workers

KILL_ITERATIONS = int(os.environ.get("AUTOPLANE_KILL_ITERATIONS", "20"))
# Each wait is for one run on a healthy worker (or a fresh one): seconds on a quiet machine, more
# on a loaded one; a kill's redelivery alone waits for Celery's worker_lost_wait (10 s).
WAIT_SECONDS = 60
RESTING = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION, RunStatus.CANCELLED,
           RunStatus.TIMED_OUT}  # fmt: skip


def run_status(run_id) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def test_three_step_automation_end_to_end(celery_workers, workspace, owner, http_server):
    body = definition(
        transform("shape", {"customer": "{{ inputs.customer }}", "total": "{{ inputs.total }}"}, output_as="order"),
        transform("big_only", "big order", when="{{ order.total > 1000 }}", output_as="flag"),
        {"step_id": "notify", "action": "http_request",
         "config": {"method": "POST", "url": http_server.url + "/notify",
                    "json": {"text": "{{ order.customer }} ordered {{ order.total }}"}}},
        inputs={"schema": {"type": "object", "properties": {"customer": {"type": "string"},
                                                             "total": {"type": "number"}}}},
        execution={"autonomy": "A3"},
    )  # fmt: skip
    api = client_for(owner)
    created = api.post("/api/v1/automations", body, format="json")
    assert created.status_code == 201, created.json()
    fired = api.post(
        f"/api/v1/automations/{created.json()['id']}/run", {"customer": "ada", "total": 42}, format="json"
    )
    assert fired.status_code == 202
    run_id = fired.json()["run_id"]
    wait_for(lambda: run_status(run_id) in RESTING, what="the run to finish")

    run = api.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "succeeded", run
    assert [s["status"] for s in run["steps"]] == ["succeeded", "skipped", "succeeded"]
    assert run["steps"][2]["output"]["data"]["status"] == 200
    assert http_server.requests[0]["body"] == '{"text":"ada ordered 42"}'
    started = AuditEvent.objects.get(trace_id=run["trace_id"], type="run.started")
    assert started.actor.startswith("worker:")
    assert not started.actor.endswith(f":{os.getpid()}")

    trace = api.get(f"/api/v1/audit?trace_id={run['trace_id']}").json()["results"]
    assert [e["type"] for e in trace][:9] == [
        "run.created", "run.started", "step.started", "step.succeeded", "step.skipped",
        "step.started", "step.succeeded", "run.succeeded", "event.published",
    ]  # fmt: skip
    assert verify_all().ok


def _side_effect_automation(workspace, url):
    return services.automation_create(workspace=workspace, definition=definition(
        transform("prepare", {"n": 1}, output_as="prep"),
        {"step_id": "charge", "action": "http_request", "timeout_seconds": 1,
         "config": {"method": "POST", "url": url, "json": {"n": "{{ prep.n }}"}}},
        execution={"autonomy": "A4"},
    ))  # fmt: skip


# 10-16 s an iteration on a shared 2-core machine (load 3 to 13), more under heavier load: each pool-process kill
# waits out Celery's worker_lost_wait (10 s) before the message is given back, and each whole-worker
# kill starts a worker and waits for the run's lease (5 s). The suite's 300 s is too short for 20.
@pytest.mark.timeout(max(300, 45 * KILL_ITERATIONS))
def test_killed_workers_lose_no_run_and_repeat_no_side_effect(worker_factory, workspace, http_server):
    """kill -9 at random points: every run ends succeeded or needs_attention, no key is executed twice."""
    worker = worker_factory(queues=["automations_fast"], concurrency=1, name="victim")
    automation = _side_effect_automation(workspace, http_server.url + "/charge")
    rng = random.Random(int(os.environ.get("AUTOPLANE_KILL_SEED", "7")))
    run_ids = []
    for iteration in range(KILL_ITERATIONS):
        mode = rng.choice(["mid_call", "mid_call", "early", "after_call", "whole_worker"])
        http_server.block = threading.Event() if mode in ("mid_call", "whole_worker") else None
        seen = len(http_server.requests)
        run = services.run_create(automation=automation, inputs={}).run
        run_ids.append(run.pk)
        # kill_pool_children kills the pool process executing a task (this run), if one is: one that
        # finished it may hold a lock of the embedded broker's pool, whose kill would wedge the pool.
        if mode == "early":
            wait_for(lambda: run_status(run.pk) != RunStatus.QUEUED, timeout=WAIT_SECONDS,
                     what="the run to be claimed")  # fmt: skip
            worker.kill_pool_children()
        elif mode in ("mid_call", "whole_worker"):
            wait_for(
                lambda: len(http_server.requests) > seen,
                timeout=WAIT_SECONDS,
                what="the side effect to start",
            )
            if mode == "whole_worker":
                worker.kill_all()
            else:
                assert worker.kill_pool_children(), "no pool process was executing the run mid-call"
            http_server.block.set()
        else:
            wait_for(lambda: StepRun.objects.filter(run=run, step_id="charge", status="succeeded").exists(),
                     timeout=WAIT_SECONDS, what="the side effect to finish")  # fmt: skip
            worker.kill_pool_children()
        if mode == "whole_worker":
            worker = worker_factory(queues=["automations_fast"], concurrency=1, name=f"victim-{iteration}")
            # The message died with the worker; the sweeper finds the run once its lease runs out.
            wait_for(lambda: Run.objects.filter(pk=run.pk, lease_expires_at__lt=timezone.now()).exists()
                     or run_status(run.pk) in RESTING, timeout=WAIT_SECONDS, what="the lease to expire")  # fmt: skip
            services.runs_sweep()
        wait_for(
            lambda: run_status(run.pk) in RESTING,
            timeout=WAIT_SECONDS,
            what=f"run {iteration} ({mode}) to come to rest",
        )

    statuses = {str(pk): run_status(pk) for pk in run_ids}
    assert set(statuses.values()) <= {RunStatus.SUCCEEDED, RunStatus.NEEDS_ATTENTION}, statuses
    keys = [r["headers"].get("Idempotency-Key") for r in http_server.requests]
    assert len(keys) == len(set(keys)), "a side effect was executed twice"
    executed_per_run = {}
    for step in StepRun.objects.filter(run_id__in=run_ids, step_id="charge"):
        executed_per_run[step.run_id] = sum(
            1 for r in http_server.requests if r["headers"].get("Idempotency-Key") == step.idempotency_key
        )
        assert executed_per_run[step.run_id] <= 1
    for pk, status in statuses.items():
        if status == RunStatus.NEEDS_ATTENTION:
            assert AuditEvent.objects.filter(refs__run=pk, type="run.needs_attention").exists()
    assert verify_all().ok
