"""Claiming a run: the one way a worker comes to own it (SPEC §7.2).

healthchecks' ``sendalerts`` pattern: a conditional ``UPDATE`` moves the run to
``running`` with this worker's id and a lease, and only a worker whose update
changed a row goes on ("nobody else got there first"). Every later write of the
executor is fenced on that claim (``claimed_by`` and the status it expects), so
a redelivered message, a late worker or a second worker changes nothing.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import F
from django.utils import timezone

from workspaces.models import Workspace

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


_CLAIM_SQL = """
UPDATE automations_run SET
    status = %(running)s, claimed_by = %(me)s, lease_expires_at = %(lease)s, wake_at = NULL,
    started_at = COALESCE(started_at, %(now)s),
    recoveries = CASE WHEN status = %(running)s AND claimed_by <> %(me)s THEN recoveries + 1 ELSE recoveries END
WHERE id = %(id)s AND (
    (status = %(queued)s AND enqueued_at IS NOT NULL)
    OR (status = %(waiting)s AND wake_at <= %(now)s)
    OR (status = %(running)s AND lease_expires_at < %(now)s)
    OR (%(held)s AND status = %(running)s AND claimed_by = %(me)s))
RETURNING *,
    (SELECT egress_allowlist FROM workspaces_workspace WHERE id = automations_run.workspace_id)
        AS claimed_egress_allowlist,
    (SELECT default_autonomy FROM workspaces_workspace WHERE id = automations_run.workspace_id)
        AS claimed_default_autonomy,
    EXISTS (SELECT 1 FROM automations_steprun WHERE run_id = automations_run.id) AS claimed_has_steps
"""


def claim(run_id: str, me: str, *, held: bool = False) -> Run | None:
    """Take ``run_id`` if it is due (queued, a timer that fired, a lease that ran out); else None.

    Taking a ``running`` run over from a worker that stopped is a *recovery*, counted
    on the run (``recoveries``) so that a run that kills its worker again and again
    ends (``AUTOPLANE_MAX_RECOVERIES``, see the executor). ``held``: this worker
    claimed the run before a database error and takes it back if it still holds it
    (not a recovery).

    One statement: the conditional UPDATE returns the run, its workspace's egress
    allowlist and default autonomy (the workspace fields a step reads) and whether it has step rows
    yet (``run.has_step_runs``: a fresh run has none to read).
    """
    now = timezone.now()
    lease = now + timedelta(seconds=settings.AUTOPLANE_RUN_LEASE_SECONDS)
    try:
        pk = uuid.UUID(str(run_id))
    except ValueError:
        return None
    adapt = connection.ops.adapt_datetimefield_value
    params = {
        "running": RunStatus.RUNNING, "queued": RunStatus.QUEUED, "waiting": RunStatus.WAITING, "me": me,
        "lease": adapt(lease), "now": adapt(now), "held": held,
        "id": Run._meta.pk.get_db_prep_value(pk, connection),
    }  # fmt: skip
    found = list(Run.objects.raw(_CLAIM_SQL, params))
    if found:
        run = found[0]
        allowlist = run.claimed_egress_allowlist
        if isinstance(allowlist, str | bytes):  # raw annotations are not converted
            allowlist = json.loads(allowlist)
        # The workspace with only what a step reads; any other field loads on use.
        run.workspace = Workspace.from_db(connection.alias, ["id", "egress_allowlist", "default_autonomy"],
                                          [run.workspace_id, allowlist, run.claimed_default_autonomy])  # fmt: skip
        run.has_step_runs = bool(run.claimed_has_steps)
        run.first_claim = run.started_at == now  # the COALESCE above kept an earlier start
        log_change(run.pk, RunStatus.RUNNING, detail=f"claimed by {me}")
        return run
    # A worker on this host that died (kill -9, OOM) leaves its lease behind;
    # take over at once instead of waiting for the lease to run out.
    row = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).values("claimed_by").first()
    taken = 0
    if row and row["claimed_by"] and row["claimed_by"] != me and claimant_is_dead(row["claimed_by"]):
        taken = Run.objects.filter(pk=run_id, status=RunStatus.RUNNING, claimed_by=row["claimed_by"]).update(
            claimed_by=me, lease_expires_at=lease, recoveries=F("recoveries") + 1
        )
    if not taken:
        return None
    run = Run.objects.select_related("workspace").get(pk=run_id)
    log_change(run.pk, RunStatus.RUNNING, detail=f"claimed by {me} (its worker died)")
    run.first_claim = False  # it was running: started before
    return run
