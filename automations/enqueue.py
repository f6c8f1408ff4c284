"""The one door from a Run row to a broker message (SPEC §2, §7.1).

Every path that puts a run on its queue (a fire, a re-run, a resolution, a
resumed approval, a due timer, a run released from behind a finished one, the
sweep) calls :func:`run_enqueue`. It sends ``autoplane.execute_run`` **by
name** on the run's duration-class queue once the current transaction commits,
so no engine module imports ``tasks.py`` (only Celery does) and a rolled-back
transaction sends nothing.

The message only says "look at this run": execution starts with a claim on the
row, so a duplicate, late or lost message is harmless. The database, not the
broker, is the record of what must run: an outbox whose rows are the runs.

- A publish that fails after the commit (broker down) is logged, never raised:
  the run is committed, so the request that created it is answered 202.
- :func:`runs_relay` (the ``autoplane.relay`` task, every
  ``AUTOPLANE_RELAY_SECONDS``) publishes every run still ``queued``
  ``AUTOPLANE_RELAY_AFTER_SECONDS`` after it was queued whose queue holds no
  message at all in the broker: its message was never sent (broker down, a web
  worker killed between commit and publish) or was lost (a flushed or restarted
  broker). Within seconds of the broker coming back, without a write per run.
  When the queue does hold messages, a missing one cannot be told apart from a
  backlog, and the sweep's ``AUTOPLANE_REQUEUE_AFTER_SECONDS`` applies.
- What the relay and the sweep send again is marked ``careful``: its message may have
  been lost with a worker that a quick step killed (see :func:`publish_run`).
"""

from __future__ import annotations

import functools
import logging
from datetime import datetime, timedelta
from importlib import import_module
from types import ModuleType

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from config import seams
from config.celery import app, queue_backlog

from .models import Run, RunStatus

logger = logging.getLogger(__name__)

EXECUTE_TASK = "autoplane.execute_run"
REDIS_PUBLISH_MODULE = "config.redis_publish"
# Timers longer than this are left to the sweep instead of a broker countdown,
# so a message never sits in the broker past its visibility timeout.
MAX_COUNTDOWN = timedelta(minutes=15)
RELAY_BATCH = 500


def publish_run(run_id: str, queue: str, *, countdown: float | None = None, careful: bool = False) -> None:
    """Send the execute message now (callers outside a transaction, e.g. a relay).

    ``ignore_result``: ``send_task`` does not read ``task_ignore_result``, and without
    it a Redis result backend SUBSCRIBEs to the task's result channel on every publish
    (and UNSUBSCRIBEs later): two more round trips on the fire's path for a result
    nobody reads (the run row is the result).

    On a Redis broker, outside a worker's task and with nothing hooked into Celery's
    publish signals, the same message is pushed by :mod:`config.redis_publish` in one
    ``LPUSH`` without kombu's publish path (~1,700 Python calls fewer per fire), and
    without waiting for Redis' reply: a push that failed is logged when the reply is
    read, before the thread's next publish (the relay publishes that run).

    ``careful``: a re-send (the relay, the sweep) of a run whose message may have died
    with its worker: the worker runs it step by step, as a message the broker gives
    back (``executor.execute_run``), so a quick step that kills whole workers is
    counted and stopped by ``AUTOPLANE_MAX_RECOVERIES`` instead of killing the next one.
    Re-sends are rare: they go through ``send_task``, which carries the keyword.
    """
    direct = _redis_publish() if countdown is None and not careful and _direct_allowed() else None
    if direct is not None and direct.usable():
        direct.publish(EXECUTE_TASK, [run_id], queue, on_lost=functools.partial(_not_published, run_id))
        return
    kwargs = {"careful": True} if careful else None
    app.send_task(
        EXECUTE_TASK, args=[run_id], kwargs=kwargs, queue=queue, countdown=countdown, ignore_result=True
    )


def _direct_allowed() -> bool:
    """The direct ``LPUSH`` writes Celery's message and kombu's envelope itself, on redis-py's
    connection without its pool: only with the fast paths on and each of them within bounds."""
    return seams.fast_path("celery") and seams.fast_path("kombu") and seams.fast_path("redis")


@functools.cache
def _redis_publish() -> ModuleType | None:
    """:mod:`config.redis_publish` on a Redis broker (imported then only: the embedded lane never loads redis)."""
    if not str(app.conf.broker_url or "").startswith("redis://"):
        return None
    return import_module(REDIS_PUBLISH_MODULE)


def _not_published(run_id: str, exc: BaseException) -> None:
    logger.warning("run %s committed but not published (%r); the relay will publish it", run_id, exc)


def _publish_committed(run_id: str, queue: str, countdown: float | None) -> None:
    try:
        publish_run(run_id, queue, countdown=countdown)
    except Exception as exc:  # kombu and redis raise several types; the run row is the record
        _not_published(run_id, exc)


def run_enqueue(run: Run, *, countdown: float | None = None) -> None:
    """Queue ``run`` for a worker after the current transaction commits (the relay if the broker is down)."""
    run_id, queue = str(run.pk), run.queue
    transaction.on_commit(lambda: _publish_committed(run_id, queue, countdown))


def runs_relay(now: datetime | None = None) -> int:
    """Publish the queued runs whose queue holds no message; returns how many were published."""
    now = now or timezone.now()
    waiting = Run.objects.filter(
        status=RunStatus.QUEUED,
        enqueued_at__lt=now - timedelta(seconds=settings.AUTOPLANE_RELAY_AFTER_SECONDS),
    )
    queues = sorted(set(waiting.values_list("queue", flat=True).distinct()))
    if not queues:
        return 0
    try:
        backlog = queue_backlog(tuple(queues))
    except Exception as exc:  # the broker is still down: the next tick tries again
        logger.info("relay: broker unreachable (%r)", exc)
        return 0
    published = 0
    for queue in queues:
        if backlog.get(queue):
            continue  # a backlog: not ours to second-guess (the sweep's requeue applies)
        for run_id in list(
            waiting.filter(queue=queue).order_by("enqueued_at").values_list("pk", flat=True)[:RELAY_BATCH]
        ):
            # Stamped, so the next tick does not send it again before a worker had a chance.
            Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(enqueued_at=now)
            publish_run(str(run_id), queue, careful=True)
            published += 1
    if published:
        logger.info("relay: published %d queued runs their queue had no message for", published)
    return published


def run_wake_at(run: Run, wake_at: datetime) -> None:
    """Queue a parked run for when its timer is due; long timers are left to the sweep."""
    delay = (wake_at - timezone.now()).total_seconds()
    if delay <= MAX_COUNTDOWN.total_seconds():
        run_enqueue(run, countdown=max(0.0, delay))
