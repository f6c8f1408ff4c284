"""A running step keeps its run: the claim's lease is renewed while the step runs.

The lease (``AUTOPLANE_RUN_LEASE_SECONDS``) is how the sweep tells a worker that
stopped from one that is busy. A step may run far longer than the lease (a
sandbox computation, a slow GET, an LLM call), with or without side effects,
so while a handler runs a :class:`LeaseKeeper` renews the lease every third of
it from a thread of its own (its own database connection). A worker that really
stopped renews nothing, and loses the run one lease later; a live one is never
robbed. A step that ends within the first third of the lease writes nothing.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from .models import Run, RunStatus

logger = logging.getLogger(__name__)


def lease_renew(run_id: str, me: str, seconds: float | None = None) -> bool:
    """Push the lease out by ``seconds`` (default: the lease), only while ``me`` holds the run."""
    seconds = settings.AUTOPLANE_RUN_LEASE_SECONDS if seconds is None else seconds
    until = timezone.now() + timedelta(seconds=seconds)
    return bool(
        Run.objects.filter(
            pk=run_id, claimed_by=me, status=RunStatus.RUNNING, lease_expires_at__lt=until
        ).update(lease_expires_at=until)
    )


class LeaseKeeper:
    """``with LeaseKeeper(run_id, me): handler(...)``: renews the lease until the block ends."""

    def __init__(self, run_id: str, me: str, lease_seconds: float | None = None):
        self.run_id = str(run_id)
        self.me = me
        self.lease = float(settings.AUTOPLANE_RUN_LEASE_SECONDS if lease_seconds is None else lease_seconds)
        self.interval = max(0.2, self.lease / 3)
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease:{self.run_id}", daemon=True)

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        # A renewal stuck behind a lock must not hold the step up: it is fenced on the
        # claim, harmless when late, and the thread closes its own connection.
        self._thread.join(timeout=0.2)

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    if lease_renew(self.run_id, self.me, self.lease):
                        self.renewals += 1
                except Exception as exc:  # a database blip: the next beat tries again
                    logger.warning("run %s: lease not renewed (%r)", self.run_id, exc)
                    connection.close()
        finally:
            connection.close()  # this thread's own connection
