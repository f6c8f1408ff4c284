"""Claiming a run: the one way a worker comes to own it (SPEC §7.2).

healthchecks' ``sendalerts`` pattern: a conditional ``UPDATE`` moves the run to
``running`` with this worker's id and a lease, and only a worker whose update
changed a row goes on ("nobody else got there first"). Every later write of the
executor is fenced on that claim (``claimed_by`` and the status it expects), so
a redelivered message, a late worker or a second worker changes nothing.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

from django.conf import settings
from django.db.models import Case, F, PositiveSmallIntegerField, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone

from .models import Run, RunStatus
from .transitions import log_change


class LostClaim(Exception):
    """Another worker owns this run now; stop without writing anything."""


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def claimant_is_dead(claimed_by: str) -> bool:
    """True for a worker process on this host that no longer runs (kill -9, OOM)."""
    host, _, pid = claimed_by.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        # A killed process stays a zombie until its parent reaps it; that is dead too.
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]  # noqa: SIM115
    except OSError:
        return True
    return state in ("Z", "X")


def claim(run_id: str, me: str, *, held: bool = False) -> Run | None:
    """Take ``run_id`` if it is due (queued, a timer that fired, a lease that ran out); else None.

    Taking a ``running`` run over from a worker that stopped is a *recovery*, counted
    on the run (``recoveries``) so that a run that kills its worker again and again
    ends (``AUTOPLANE_MAX_RECOVERIES``, see the executor). ``held``: this worker
    claimed the run before a database error and takes it back if it still holds it
    (not a recovery).
    """
    now = timezone.now()
    lease = now + timedelta(seconds=settings.AUTOPLANE_RUN_LEASE_SECONDS)
    claimable = (
        Q(status=RunStatus.QUEUED, enqueued_at__isnull=False)
        | Q(status=RunStatus.WAITING, wake_at__lte=now)
        | Q(status=RunStatus.RUNNING, lease_expires_at__lt=now)
    )
    if held:
        claimable |= Q(status=RunStatus.RUNNING, claimed_by=me)
    taken = Run.objects.filter(claimable, pk=run_id).update(
        status=RunStatus.RUNNING, claimed_by=me, lease_expires_at=lease, wake_at=None,
        started_at=Coalesce(F("started_at"), Value(now)),
        # SET reads the row as it was: a run that was running is being recovered, unless it is ours.
        recoveries=Case(When(Q(status=RunStatus.RUNNING) & ~Q(claimed_by=me), then=F("recoveries") + 1),
                        default=F("recoveries"), output_field=PositiveSmallIntegerField()),
    )  # fmt: skip
    if not taken:
        # A worker on this host that died (kill -9, OOM) leaves its lease behind;
        # take over at once instead of waiting for the lease to run out.
        row = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).values("claimed_by").first()
        if row and row["claimed_by"] and row["claimed_by"] != me and claimant_is_dead(row["claimed_by"]):
            taken = Run.objects.filter(
                pk=run_id, status=RunStatus.RUNNING, claimed_by=row["claimed_by"]
            ).update(claimed_by=me, lease_expires_at=lease, recoveries=F("recoveries") + 1)
    if not taken:
        return None
    run = Run.objects.select_related("workspace").get(pk=run_id)
    log_change(run.pk, RunStatus.RUNNING, detail=f"claimed by {me}")
    run.first_claim = run.started_at == now  # the Coalesce above kept an earlier start
    return run
