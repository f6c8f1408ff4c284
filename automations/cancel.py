"""Watching for a cancel while a step's handler runs (SPEC §7.2, "cancel takes effect promptly").

The handler runs in the worker's main thread; a :class:`CancelWatch` thread
polls the run's ``cancel_requested`` flag every ``POLL_SECONDS`` and, once it
is set, sets the handler's ``ctx.cancelled`` event. Interruptible handlers wait
on that event: the sandbox kills the step's process group, an HTTP call in
flight is abandoned. The watch uses its own database connection and closes it.
"""

from __future__ import annotations

import logging
import threading

from django.db import connection

from .models import Run

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.5


class CancelWatch:
    def __init__(self, run_id: str, cancelled: threading.Event, interval: float = POLL_SECONDS):
        self.run_id = run_id
        self.cancelled = cancelled
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"cancel-watch-{run_id}", daemon=True)

    def __enter__(self) -> CancelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A watch stuck in a query must not hold up the step: it stops on its own and closes its connection.
        self._thread.join(timeout=0.2)

    def _watch(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                if Run.objects.filter(pk=self.run_id, cancel_requested=True).exists():
                    self.cancelled.set()
                    return
        except Exception:  # a watch that cannot read only loses promptness: the step boundary still stops
            logger.warning("run %s: cancel watch stopped", self.run_id, exc_info=True)
        finally:
            connection.close()
