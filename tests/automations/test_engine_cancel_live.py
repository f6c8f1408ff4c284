"""Live: a cancel reaches a running sandbox step or HTTP call, and step statuses are true while they last.

A real worker runs the steps; the test samples the database the way an
operator's API poll would, with deadlines instead of sleeps.
"""

from __future__ import annotations

import subprocess
import time
import uuid

import pytest

from audit.models import AuditEvent
from automations import services
from automations.models import Run, RunStatus, StepRun
from capabilities.sandbox import BubblewrapBackend
from tests.factories import definition
from tests.live import wait_for

pytestmark = pytest.mark.workers


def _step_status(run_id, step_id: str) -> str | None:
    return StepRun.objects.filter(run_id=run_id, step_id=step_id).values_list("status", flat=True).first()


def _sandbox_pids(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


@pytest.fixture
def bwrap():
    if not BubblewrapBackend().available():
        pytest.skip("bubblewrap cannot start a sandbox here")


def test_cancel_kills_a_running_sandbox_step_within_seconds(celery_workers, workspace, bwrap):
    marker = f"nap_{uuid.uuid4().hex}"
    automation = services.automation_create(workspace=workspace, definition=definition(
        {"step_id": "nap", "action": "run_python", "timeout_seconds": 120,
         "config": {"code": f"import subprocess\nsubprocess.run(['sh', '-c', 'sleep 60 # {marker}'])"}},
        execution={"autonomy": "A4"},
    ))  # fmt: skip
    run = services.run_create(automation=automation, inputs={}).run
    wait_for(lambda: _step_status(run.pk, "nap") == "running", what="the step to show running")
    wait_for(lambda: _sandbox_pids(marker), what="the sandbox process to start")

    services.run_cancel(run=run)
    cancelled_at = time.monotonic()
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED, timeout=5, what="run cancelled"
    )

    assert time.monotonic() - cancelled_at < 5
    assert _step_status(run.pk, "nap") == "cancelled"
    assert _sandbox_pids(marker) == []
    event = AuditEvent.objects.get(trace_id=run.trace_id, type="step.cancelled")
    assert "sandbox process group was killed" in event.payload["interrupted"]


def test_cancel_abandons_an_http_call_in_flight_within_seconds(celery_workers, workspace, slow_server):
    automation = services.automation_create(workspace=workspace, definition=definition(
        {"step_id": "fetch", "action": "http_request", "timeout_seconds": 110,
         "config": {"url": slow_server.url, "timeout_seconds": 100}},
    ))  # fmt: skip
    run = services.run_create(automation=automation, inputs={}).run
    wait_for(lambda: _step_status(run.pk, "fetch") == "running", what="the step to show running")
    assert slow_server.arrived.wait(30), "the request never reached the server"

    services.run_cancel(run=run)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED, timeout=5, what="run cancelled"
    )

    assert not slow_server.release.is_set()  # the server still holds its answer: the call was abandoned
    assert _step_status(run.pk, "fetch") == "cancelled"
    event = AuditEvent.objects.get(trace_id=run.trace_id, type="step.cancelled")
    assert "GET request to 127.0.0.1 was abandoned in flight" in event.payload["interrupted"]
    assert Run.objects.get(pk=run.pk).error["interrupted"] == event.payload["interrupted"]


def test_a_waiting_step_shows_waiting_until_its_timer_fires(celery_workers, workspace):
    automation = services.automation_create(workspace=workspace, definition=definition(
        {"step_id": "pause", "action": "wait", "config": {"seconds": 2}},
        {"step_id": "after", "action": "transform_data", "config": {"output": "done"}},
    ))  # fmt: skip
    run = services.run_create(automation=automation, inputs={}).run

    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.WAITING, what="the run to wait")
    assert _step_status(run.pk, "pause") == "waiting"
    wait_for(lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED, what="the run to finish")
    assert _step_status(run.pk, "pause") == "succeeded"
    assert _step_status(run.pk, "after") == "succeeded"
