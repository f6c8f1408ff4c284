"""The one door from a Run row to a broker message (SPEC §2, §7.1).

Every path that puts a run on its queue (a fire, a re-run, a resolution, a
resumed approval, a due timer, a run released from behind a finished one, the
sweep) calls :func:`run_enqueue`. It sends ``autoplane.execute_run`` **by
name** on the run's duration-class queue once the current transaction commits,
so no engine module imports ``tasks.py`` (only Celery does) and a rolled-back
transaction sends nothing.

The message only says "look at this run": execution starts with a claim on the
row, so a duplicate, late or lost message is harmless (the sweep re-sends lost
ones). The database, not the broker, is the record of what must run.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from config.celery import app

from .models import Run

EXECUTE_TASK = "autoplane.execute_run"
# Timers longer than this are left to the sweep instead of a broker countdown,
# so a message never sits in the broker past its visibility timeout.
MAX_COUNTDOWN = timedelta(minutes=15)


def publish_run(run_id: str, queue: str, *, countdown: float | None = None) -> None:
    """Send the execute message now (callers outside a transaction, e.g. a relay)."""
    app.send_task(EXECUTE_TASK, args=[run_id], queue=queue, countdown=countdown)


def run_enqueue(run: Run, *, countdown: float | None = None) -> None:
    """Queue ``run`` for a worker after the current transaction commits."""
    run_id, queue = str(run.pk), run.queue
    transaction.on_commit(lambda: publish_run(run_id, queue, countdown=countdown))


def run_wake_at(run: Run, wake_at: datetime) -> None:
    """Queue a parked run for when its timer is due; long timers are left to the sweep."""
    delay = (wake_at - timezone.now()).total_seconds()
    if delay <= MAX_COUNTDOWN.total_seconds():
        run_enqueue(run, countdown=max(0.0, delay))
