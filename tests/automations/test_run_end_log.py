"""A run's end is logged once it reached the database (issue 11, PostgreSQL): the line
``run … running -> succeeded`` is written after the run's final query and its COMMIT, not
while they are on their way, and a worker whose end did not stick (its claim lost) logs none."""

from __future__ import annotations

import logging

import psycopg
import pytest
from django.db import connection, transaction

from audit import writer
from automations import executor, services
from automations.claim import claim
from automations.models import RunStatus
from tests.factories import definition, transform

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="the run's end in one query: PostgreSQL"),
]


@pytest.fixture(autouse=True)
def _no_publish(monkeypatch):
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


class _SeenByOthers(logging.Handler):
    """On each run log line, what another session of the database sees of the run."""

    def __init__(self):
        super().__init__(logging.INFO)
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        self.other = psycopg.connect(**params, autocommit=True)
        self.seen: list[tuple[str, str | None]] = []

    def emit(self, record: logging.LogRecord) -> None:
        run_id = str(record.args[0]) if record.args else ""
        row = self.other.execute("SELECT status FROM automations_run WHERE id = %s", [run_id]).fetchone()
        self.seen.append((record.getMessage().removeprefix(f"run {run_id} "), row[0] if row else None))


@pytest.fixture
def seen():
    handler = _SeenByOthers()
    logger = logging.getLogger("autoplane.runs")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield handler.seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        handler.other.close()


def _one_step_run(workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("greet", {"a": 1}))
    )
    return services.run_create(automation=automation, inputs={}).run


def test_the_end_of_a_run_is_logged_once_another_session_sees_it(workspace, seen):
    run = _one_step_run(workspace)
    seen.clear()  # the run's "queued" line
    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
    # the claim's line comes while its transaction is open (others still see the run queued);
    # the end's line once the run's end is committed
    assert seen == [(f"running: claimed by {seen[0][0].split('claimed by ')[1]}", RunStatus.QUEUED),
                    ("running -> succeeded", RunStatus.SUCCEEDED)]  # fmt: skip


def test_an_end_that_did_not_stick_is_not_logged(workspace, seen):
    # given an executor that is not the run's claimant: its fence misses in the final query
    run = _one_step_run(workspace)
    seen.clear()
    with transaction.atomic(), writer.batch():
        claimed = claim(str(run.pk), "worker-a:1")
        assert claimed is not None
        assert executor.Executor(claimed, "worker-b:2").begin() is False
    # then no change to succeeded was logged: the run is still queued for everyone
    assert [line for line, _ in seen] == ["running: claimed by worker-a:1"]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
