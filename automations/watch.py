"""While a step's handler runs, one thread per step keeps the run's lease and watches for a cancel.

**The lease.** The claim's lease (``AUTOPLANE_RUN_LEASE_SECONDS``) is how the sweep
tells a worker that stopped from one that is busy. A step may run far longer than
the lease (a sandbox computation, a slow GET, an LLM call), so the watch renews it
every third of the lease. A worker that really stopped renews nothing and loses the
run one lease later; a live one is never robbed. A step that ends within the first
third of the lease writes nothing.

**A cancel** (SPEC §7.2, "cancel takes effect promptly"). For an action declared
``interruptible``, the watch also reads the run's ``cancel_requested`` flag every
``CANCEL_POLL_SECONDS`` and, once it is set, sets the handler's ``ctx.cancelled``:
the sandbox kills the step's process group, an HTTP call in flight has its
connection shut down. A handler that cannot be interrupted runs to its end; the
API and admin show the run's ``cancel_requested`` meanwhile.

The thread uses its own database connection and closes it. A read or a renewal
that fails (a database blip) is tried again on the next beat: the watch only loses
promptness, and the step boundary still sees the cancel.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from .models import Run, RunStatus

logger = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = 0.5


def lease_renew(run_id: str, me: str, seconds: float | None = None) -> bool:
    """Push the lease out by ``seconds`` (default: the lease), only while ``me`` holds the run."""
    seconds = settings.AUTOPLANE_RUN_LEASE_SECONDS if seconds is None else seconds
    until = timezone.now() + timedelta(seconds=seconds)
    return bool(
        Run.objects.filter(
            pk=run_id, claimed_by=me, status=RunStatus.RUNNING, lease_expires_at__lt=until
        ).update(lease_expires_at=until)
    )


class StepWatch:
    """``with StepWatch(run_id, me, ctx.cancelled): handler(ctx, config)``.

    ``cancelled`` is None for a handler that cannot be interrupted: then only the lease is kept.
    """

    def __init__(self, run_id: str, me: str, cancelled: threading.Event | None, *,
                 lease_seconds: float | None = None, poll_seconds: float = CANCEL_POLL_SECONDS):  # fmt: skip
        self.run_id = str(run_id)
        self.me = me
        self.cancelled = cancelled
        self.lease = float(settings.AUTOPLANE_RUN_LEASE_SECONDS if lease_seconds is None else lease_seconds)
        self.renew_every = max(0.2, self.lease / 3)
        self.poll = poll_seconds
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"step-watch:{self.run_id}", daemon=True)

    def __enter__(self) -> StepWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # A query stuck behind a lock must not hold the step up: a renewal is fenced on the
        # claim and harmless when late, and the thread closes its own connection.
        self._thread.join(timeout=0.2)

    def _watching_cancel(self) -> bool:
        return self.cancelled is not None and not self.cancelled.is_set()

    def _run(self) -> None:
        next_renewal = time.monotonic() + self.renew_every
        try:
            while True:
                pause = max(0.0, next_renewal - time.monotonic())
                if self._watching_cancel():
                    pause = min(pause, self.poll)
                if self._stop.wait(pause):
                    return
                if self._watching_cancel():
                    self._beat("cancel not read", self._read_cancel)
                if time.monotonic() >= next_renewal:
                    next_renewal = time.monotonic() + self.renew_every
                    self._beat("lease not renewed", self._renew)
        finally:
            connection.close()  # this thread's own connection

    def _read_cancel(self) -> None:
        if Run.objects.filter(pk=self.run_id, cancel_requested=True).exists():
            assert self.cancelled is not None
            self.cancelled.set()  # runs the handler's cancel callbacks (an HTTP call's abort) here

    def _renew(self) -> None:
        if lease_renew(self.run_id, self.me, self.lease):
            self.renewals += 1

    def _beat(self, failed: str, work) -> None:
        try:
            work()
        except Exception as exc:  # a database blip: the next beat tries again
            logger.warning("run %s: %s (%r)", self.run_id, failed, exc)
            connection.close()
