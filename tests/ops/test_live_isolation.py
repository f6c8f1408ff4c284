"""No test is raced by a worker it did not ask for (tests/conftest.py, ``stop_unasked_consumers``).

The session's shared worker outlives the test that started it; a test after it that
commits runs and publishes them must not have them executed behind its back. The
two tests below run in this order (a worker test, then one without workers).
"""

from __future__ import annotations

import time

import pytest

from automations import services
from automations.models import RunStatus
from config.celery import QUEUE_FAST, queue_backlog
from tests import live
from tests.conftest import stop_unasked_consumers
from tests.factories import definition, transform

LOOK_SECONDS = 2.0  # the embedded broker is polled every 0.02 s in the tests, Redis pushes at once


@pytest.mark.workers
def test_the_shared_worker_runs_for_a_test_that_asks_for_it(celery_workers):
    assert celery_workers.main.alive()
    assert live.running() == [celery_workers.main]


@pytest.mark.django_db(transaction=True)
def test_a_run_a_test_without_workers_publishes_is_taken_by_no_worker(workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("t", {"n": 1}))
    )
    before = queue_backlog((QUEUE_FAST,))[QUEUE_FAST]

    run = services.run_create(automation=automation, inputs={}).run  # committed, then published
    time.sleep(LOOK_SECONDS)

    assert live.running() == []
    run.refresh_from_db()
    assert (run.queue, run.status) == (QUEUE_FAST, RunStatus.QUEUED)
    assert queue_backlog((QUEUE_FAST,))[QUEUE_FAST] == before + 1


@pytest.mark.workers
def test_a_worker_a_test_started_and_left_running_is_killed_and_named(transactional_db):
    stray = live.WorkerProcess([QUEUE_FAST], name="left-running").start()
    try:
        assert stop_unasked_consumers(asked=False) == [stray]
        assert not stray.alive()
        assert live.running() == []
    finally:
        stray.kill_all()
