"""``bench --http``'s observer: sees runs final with one plain statement per poll, off the ORM."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection

from automations import services
from automations.models import Run
from bench.http_bench import Seer, StatusReader, wait_final
from tests.factories import definition, transform


@pytest.fixture
def runs(transactional_db, workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("a", {"x": 1}))
    )
    return [services.run_create(automation=automation, inputs={}).run for _ in range(StatusReader.WINDOW + 6)]


def _finish(run_ids, status="succeeded", delay=0.1):
    def update() -> None:
        Run.objects.filter(pk__in=run_ids).update(status=status)
        connection.close()  # this thread's own connection

    timer = threading.Timer(delay, update)
    timer.start()
    return timer


def test_the_reader_reads_a_runs_status_with_its_own_connection(runs):
    reader = StatusReader()
    try:
        assert reader.status(runs[0].pk) == "queued"
        assert reader.status(uuid.uuid4()) is None
        Run.objects.filter(pk=runs[0].pk).update(status="succeeded")
        assert reader.status(runs[0].pk) == "succeeded"
        assert reader.final_among([runs[0].pk, runs[1].pk]) == [(runs[0].pk, "succeeded")]
    finally:
        reader.close()


def test_the_completion_wait_returns_when_every_run_is_final_and_counts_the_failed(runs):
    ids = [str(run.pk) for run in runs]
    late = _finish([run.pk for run in runs[:-2]], delay=0.05)
    last = _finish([runs[-2].pk], status="failed", delay=0.2)
    Run.objects.filter(pk=runs[-1].pk).update(status="succeeded")  # a run final before the wait began
    result: list = []
    waiting = threading.Thread(target=lambda: result.append(wait_final(ids, interval=0.01, timeout=30)))
    waiting.start()
    waiting.join(30)
    late.join()
    last.join()

    assert result == [(len(runs), 1)]


def test_the_completion_wait_gives_up_and_reports_what_it_saw(runs):
    Run.objects.filter(pk=runs[0].pk).update(status="succeeded")

    assert wait_final([str(runs[0].pk), str(runs[1].pk)], interval=0.01, timeout=0.2) == (1, 0)


def test_the_seer_polls_the_database_until_the_run_is_final(runs):
    seer = Seer("db", 0, "", 0.001)
    timer = _finish([runs[0].pk])
    try:
        seer.wait(str(runs[0].pk), client=None, timeout=30)
    finally:
        seer.close()
        timer.join()
    assert seer.polls > 1
