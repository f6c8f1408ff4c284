"""The PostgreSQL health check before a kept connection's first query (config.postgresql, issue 11).

An idle connection with nothing to read is usable without a ``SELECT 1`` round
trip; one whose session the server ended is found broken, closed and replaced
before the request's first query, as with Django's own check.
"""

from __future__ import annotations

import select

import psycopg
import pytest
from django.db import close_old_connections, connection

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def other():
    if connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL lane's backend")
    s = connection.settings_dict
    with psycopg.connect(dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None, host=s["HOST"],
                         port=s["PORT"] or None, autocommit=True) as conn:  # fmt: skip
        yield conn


def _last_query(other: psycopg.Connection, pid: int) -> str:
    return other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()[0]


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid() /* health-check-marker */")
        return cursor.fetchone()[0]


def test_the_settings_use_the_backend_with_health_checks(other):
    assert connection.settings_dict["ENGINE"] == "config.postgresql"
    assert connection.settings_dict["CONN_HEALTH_CHECKS"] is True


def test_an_idle_healthy_connection_is_usable_without_a_round_trip(other):
    pid = _backend_pid()
    assert connection.is_usable()
    connection.health_check_done = False  # as request_started leaves it
    connection.close_if_health_check_failed()
    assert connection.connection is not None
    assert connection.health_check_done
    assert "health-check-marker" in _last_query(other, pid)  # no SELECT 1 reached the server
    assert _backend_pid() == pid


def test_a_connection_inside_a_transaction_is_still_asked(other):
    pid = _backend_pid()
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            assert connection.is_usable()
            assert _last_query(other, pid) == "SELECT 1"
        finally:
            cursor.execute("ROLLBACK")


def test_a_session_the_server_ended_is_replaced_before_the_next_query(other):
    pid = _backend_pid()
    assert other.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    poller = select.poll()
    poller.register(connection.connection.fileno(), select.POLLIN)
    assert poller.poll(10_000), "the server's goodbye never arrived"
    assert not connection.is_usable()
    close_old_connections()  # a new request (or Celery task) starts
    assert _backend_pid() != pid
