"""A worker keeps its database connection from task to task (issue 11), and its heap out of
the garbage collector's way.

Celery's Django fixup closes every connection before and after every task, so each
run paid for a new PostgreSQL session (a backend fork, then every statement planned
against cold catalog caches). config.celery applies Django's own rule instead:
a connection lives for ``CONN_MAX_AGE`` and is closed when broken.
"""

from __future__ import annotations

import pytest
from django.db import connection

from config.celery import app
from tests.live import live_worker_env


def _sessions(count: int) -> list[str]:
    return [app.send_task("tests.database_session", queue="default").get(timeout=30) for _ in range(count)]


def test_consecutive_tasks_of_a_pool_process_share_one_database_session(worker_factory):
    worker = worker_factory(queues=["default"], concurrency=1)
    sessions = _sessions(4)
    # The worker runs on these settings; SQLite's default CONN_MAX_AGE is 0 (a connection per task).
    assert len(set(sessions)) == (1 if connection.settings_dict["CONN_MAX_AGE"] != 0 else 4), sessions
    assert worker.alive()


def test_a_connection_past_conn_max_age_is_replaced_between_tasks(worker_factory):
    if connection.vendor != "postgresql":
        pytest.skip("DATABASE_CONN_MAX_AGE is the PostgreSQL lane's setting")
    worker_factory(queues=["default"], concurrency=1, env=live_worker_env(DATABASE_CONN_MAX_AGE="0"))
    assert len(set(_sessions(3))) == 3


def test_a_pool_process_freezes_what_it_inherited_out_of_the_garbage_collectors_reach(worker_factory):
    """A full collection would walk Django, the tasks and the capabilities (~160k objects) in
    a pause of ~100 ms every few hundred runs; a pool process freezes them after its fork."""
    worker_factory(queues=["default"], concurrency=1)
    state = app.send_task("tests.gc_state", queue="default").get(timeout=30)
    assert state["frozen"] > 50_000, state
    assert state["tracked"] < state["frozen"] // 4, state
