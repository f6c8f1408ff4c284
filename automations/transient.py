"""Transient database errors are waited out, not acked away.

A database restart, a failover or a killed connection (``pg_terminate_backend``)
fails the statement in flight with an ``OperationalError`` (or ``InterfaceError``
on a connection already closed). A worker that let that escape would have its
``execute_run`` message acked with the run left half-done until the sweep found
it. Instead the worker closes the broken connection and tries again with a
capped backoff (``RETRY_DELAYS``), for up to ``AUTOPLANE_DB_RETRY_SECONDS``:
the run goes on within a second or two of the database coming back. Past that,
the error is raised and the run is the sweep's (its lease runs out).

Inside a transaction nothing can be retried here: the error goes up to whoever
opened it (a batch of quick steps is repeated whole; a test's transaction fails).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

logger = logging.getLogger(__name__)

TRANSIENT_ERRORS = (OperationalError, InterfaceError)
# Capped backoff: quick first tries (a killed connection reconnects at once), then
# every 2 s, so the work goes on within 2 s of the database coming back.
RETRY_DELAYS = (0.05, 0.2, 0.5, 1.0, 2.0)

T = TypeVar("T")


def retry_delays() -> Iterator[float]:
    """The delays before each retry, until ``AUTOPLANE_DB_RETRY_SECONDS`` have passed."""
    give_up = time.monotonic() + settings.AUTOPLANE_DB_RETRY_SECONDS
    attempt = 0
    while True:
        delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
        if time.monotonic() + delay > give_up:
            return
        yield delay
        attempt += 1


def retryable(exc: BaseException) -> bool:
    """A transient error this connection can recover from by reconnecting (not inside a transaction)."""
    return isinstance(exc, TRANSIENT_ERRORS) and not connection.in_atomic_block


def wait_out(exc: BaseException, delays: Iterator[float], what: str) -> None:
    """Drop the broken connection and sleep before the next try; re-raise once the time is up."""
    delay = next(delays, None)
    if delay is None:
        raise exc
    logger.warning("%s: database error (%s); retrying in %.2f s", what, str(exc).strip()[:200], delay)
    connection.close()  # the next query opens a new one
    time.sleep(delay)


def with_retries(fn: Callable[[], T], what: str, *, before_retry: Callable[[], None] | None = None) -> T:
    """``fn()``, called again after a transient database error (``before_retry`` first)."""
    delays = retry_delays()
    while True:
        try:
            return fn()
        except TRANSIENT_ERRORS as exc:
            if not retryable(exc):
                raise
            wait_out(exc, delays, what)
            if before_retry is not None:
                before_retry()
