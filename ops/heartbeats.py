"""Each Celery worker and the beat process write a heartbeat row every few seconds.

The embedded broker (kombu's SQLAlchemy transport) has no broadcast, so
``app.control.inspect()`` cannot find workers there; a row per process in the
database works the same on every broker and is what ``/healthz`` reads.

- A worker starts its heartbeat thread on ``worker_ready`` (it is consuming by
  then) and deletes its row on ``worker_shutdown``.
- Beat starts its thread on ``beat_init`` and only beats while its scheduler
  loop keeps ticking, so a wedged beat goes stale like a dead one.
- The scheduled ``autoplane.beat_heartbeat`` task (ops/tasks.py) records a
  ``tick`` row when a worker executes it: beat -> broker -> worker works.

The threads are daemons and write on their own database connection; a write
that fails (database briefly locked or down) is logged and retried next time.
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from celery import signals
from django.db import close_old_connections
from django.utils import timezone

from .models import HeartbeatKind
from .selectors import HEARTBEAT_INTERVAL, STALE_AFTER

logger = logging.getLogger(__name__)


class Pulse:
    """Calls ``beat`` now and then every ``interval`` seconds on a daemon thread until stopped."""

    def __init__(self, name: str, beat: Callable[[], None], interval: float = HEARTBEAT_INTERVAL):
        self.name = name
        self._beat = beat
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat:{name}", daemon=True)

    def start(self) -> Pulse:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self._interval + 1)

    def _run(self) -> None:
        while True:
            close_old_connections()
            try:
                self._beat()
            except Exception as exc:
                logger.warning("heartbeat %s not recorded: %s", self.name, exc)
            finally:
                close_old_connections()
            if self._stop.wait(self._interval):
                return


_pulse: Pulse | None = None


def _consumed_queues(consumer, fallback: list[str]) -> list[str]:
    task_consumer = getattr(consumer, "task_consumer", None)
    queues = getattr(task_consumer, "queues", None)
    return sorted(q.name for q in queues) if queues else fallback


def on_worker_ready(sender=None, **kwargs) -> None:
    from .services import heartbeat_record

    global _pulse
    consumer = sender
    name = str(consumer.hostname)
    initial = sorted(consumer.app.amqp.queues.consume_from)
    started_at, pid, host = timezone.now(), os.getpid(), socket.gethostname()

    def beat() -> None:
        heartbeat_record(
            name=name, kind=HeartbeatKind.WORKER, queues=_consumed_queues(consumer, initial),
            hostname=host, pid=pid, started_at=started_at,
        )  # fmt: skip

    _pulse = Pulse(name, beat).start()


def on_worker_shutdown(sender=None, **kwargs) -> None:
    from .services import heartbeat_clear

    global _pulse
    if _pulse is None:
        return
    pulse, _pulse = _pulse, None
    pulse.stop()
    try:
        close_old_connections()
        heartbeat_clear(name=pulse.name)
    except Exception as exc:
        logger.warning("heartbeat %s not cleared: %s", pulse.name, exc)


def on_beat_init(sender=None, **kwargs) -> None:
    from .services import heartbeat_record

    global _pulse
    service = sender
    name = f"beat@{socket.gethostname()}"
    started_at, pid, host = timezone.now(), os.getpid(), socket.gethostname()

    def beat() -> None:
        # Celery stamps _last_tick on every scheduler pass; when it stops moving
        # the beat is wedged and must stop looking alive.
        last_tick = getattr(service, "_last_tick", None)
        if last_tick is not None and time.monotonic() - last_tick > STALE_AFTER.total_seconds():
            logger.warning("beat scheduler has not ticked for %.0f s", time.monotonic() - last_tick)
            return
        heartbeat_record(name=name, kind=HeartbeatKind.BEAT, hostname=host, pid=pid, started_at=started_at)

    _pulse = Pulse(name, beat).start()
    # Beat has no shutdown signal; SIGTERM ends it through SystemExit, which runs atexit.
    atexit.register(on_worker_shutdown)


def connect() -> None:
    signals.worker_ready.connect(on_worker_ready, weak=False, dispatch_uid="ops.heartbeat.worker_ready")
    signals.worker_shutdown.connect(
        on_worker_shutdown, weak=False, dispatch_uid="ops.heartbeat.worker_shutdown"
    )
    signals.beat_init.connect(on_beat_init, weak=False, dispatch_uid="ops.heartbeat.beat_init")
