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
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import F
from django.utils import timezone

from config import one_round_trip
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
    (SELECT max_autonomy FROM workspaces_workspace WHERE id = automations_run.workspace_id)
        AS claimed_max_autonomy,
    (SELECT min_approvals FROM workspaces_workspace WHERE id = automations_run.workspace_id)
        AS claimed_min_approvals,
    (SELECT policies FROM workspaces_workspace WHERE id = automations_run.workspace_id) AS claimed_policies,
    (SELECT quiet_hours FROM workspaces_workspace WHERE id = automations_run.workspace_id) AS claimed_quiet_hours,
    EXISTS (SELECT 1 FROM automations_steprun WHERE run_id = automations_run.id) AS claimed_has_steps
"""


# How a row of the claim's RETURNING becomes a Run, per (connection alias, columns): the model's
# fields present in it (in the model's order) and their positions, each field's converters (the
# backend's, then the field's, as the ORM's compiler applies them), the other columns' positions.
_Shape = tuple[list[str], list[int], list[tuple[int, list[Any], Any]], list[tuple[str, int]]]
_shapes: dict[tuple[str, tuple[str, ...]], _Shape] = {}


def _row_shape(columns: tuple[str, ...]) -> _Shape:
    key = (connection.alias, columns)
    shape = _shapes.get(key)
    if shape is None:
        position = {name: i for i, name in enumerate(columns)}
        fields = [f for f in Run._meta.concrete_fields if f.column in position]
        converters = []
        for field in fields:
            col = field.get_col(Run._meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if found:
                converters.append((position[field.column], found, col))
        known = {f.column for f in fields}
        extra = [(name, i) for i, name in enumerate(columns) if name not in known]
        shape = _shapes[key] = (
            [f.attname for f in fields],
            [position[f.column] for f in fields],
            converters,
            extra,
        )
    return shape


def _claimed_run(columns: list[str], row: tuple[Any, ...]) -> tuple[Run, dict[str, Any]]:
    """The claimed row as a Run (``Run.from_db``, the values converted as a query's would be)
    and the claim's other columns by name."""
    names, positions, converters, extra = _row_shape(tuple(columns))
    values = list(row)
    for i, found, col in converters:
        value = values[i]
        for convert in found:
            value = convert(value, col, connection)
        values[i] = value
    run = Run.from_db(connection.alias, names, [values[i] for i in positions])
    return run, {name: values[i] for name, i in extra}


def _json(value: Any) -> Any:
    """A JSON column of the claim's extra columns (they are not converted): text on SQLite."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def claim(run_id: str, me: str, *, held: bool = False) -> Run | None:
    """Take ``run_id`` if it is due (queued, a timer that fired, a lease that ran out); else None.

    Taking a ``running`` run over from a worker that stopped is a *recovery*, counted
    on the run (``recoveries``) so that a run that kills its worker again and again
    ends (``AUTOPLANE_MAX_RECOVERIES``, see the executor). ``held``: this worker
    claimed the run before a database error and takes it back if it still holds it
    (not a recovery).

    One statement: the conditional UPDATE returns the run, its workspace's egress
    allowlist, default autonomy, ceilings, policies and quiet hours (the workspace fields a
    step reads) and whether it has step rows yet (``run.has_step_runs``: a fresh run has none
    to read).
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
    # The transaction's BEGIN goes in the claim's query (one round trip fewer), and the row
    # becomes a Run as Run.objects.raw() would make it, without a RawQuerySet per claim.
    columns, rows = one_round_trip.first_in_transaction(_CLAIM_SQL, params, using=connection.alias)
    if rows:
        run, extra = _claimed_run(columns, rows[0])
        allowlist, policies, quiet_hours = (
            _json(extra[name])
            for name in ("claimed_egress_allowlist", "claimed_policies", "claimed_quiet_hours")
        )
        # The workspace with only what a step reads (its gate settings too); any other field loads on use.
        run.workspace = Workspace.from_db(
            connection.alias,
            ["id", "egress_allowlist", "default_autonomy", "max_autonomy", "min_approvals", "policies", "quiet_hours"],
            [run.workspace_id, allowlist, extra["claimed_default_autonomy"], extra["claimed_max_autonomy"],
             extra["claimed_min_approvals"], policies, quiet_hours],
        )  # fmt: skip
        run.has_step_runs = bool(extra["claimed_has_steps"])
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
