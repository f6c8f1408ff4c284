"""The live-process fixtures themselves: real workers, heartbeats, kills."""

from __future__ import annotations

import os
import time

import pytest

from config.celery import QUEUES, ping
from config.celery import app as celery_app
from ops.models import Heartbeat
from ops.selectors import workers_by_queue

pytestmark = pytest.mark.workers


def test_a_worker_is_counted_for_its_queues_and_gone_when_it_stops(worker_factory):
    worker = worker_factory(queues=["automations_fast", "automations_medium"])

    assert workers_by_queue(QUEUES) == {"default": 0, "automations_fast": 1, "automations_medium": 1,
                                        "automations_long": 0}  # fmt: skip
    # A warm shutdown on a loaded 2-core machine can take several seconds; the
    # point here is that a graceful stop clears the row, so give it the time.
    worker.stop(timeout=60)
    assert not Heartbeat.objects.filter(name=worker.nodename).exists()


def test_ping_runs_in_a_real_worker_process_on_every_queue(celery_workers):
    for queue in QUEUES:
        result = ping.apply_async(args=[queue], queue=queue).get(timeout=30, interval=0.02)

        assert result["value"] == queue
        assert result["pid"] != os.getpid()
        assert result["pid"] in celery_workers.main.pids()


def test_a_pool_process_killed_mid_task_is_replaced(worker_factory, tmp_path):
    worker = worker_factory(queues=["automations_fast"], concurrency=1)
    pid_file = tmp_path / "pid"
    celery_app.send_task("tests.sleep", args=[30, str(pid_file)], queue="automations_fast")
    deadline = time.monotonic() + 30
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    victim = int(pid_file.read_text())

    worker.kill_pid(victim)
    result = ping.apply_async(args=["after"], queue="automations_fast").get(timeout=30, interval=0.02)

    assert result["pid"] != victim
    assert result["pid"] in worker.pool_pids()


def test_killing_pool_children_of_an_idle_worker_never_wedges_it(worker_factory):
    worker = worker_factory(queues=["automations_fast"], concurrency=2)

    worker.kill_pool_children()
    results = [ping.apply_async(args=[n], queue="automations_fast") for n in range(3)]

    assert [r.get(timeout=30, interval=0.02)["value"] for r in results] == [0, 1, 2]


def test_beat_announces_itself_while_running_and_clears_when_stopped(beat_process):
    beat = beat_process()

    beats = list(Heartbeat.objects.filter(kind="beat").values_list("pid", flat=True))
    assert beats == [beat.pid]
    beat.stop()
    assert not Heartbeat.objects.filter(kind="beat").exists()
