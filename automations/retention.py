"""Retention of run history: finished runs past the window are deleted, in small batches.

A run is pruned when all of these hold:

* its workspace has a retention (``AUTOPLANE_RUN_RETENTION_DAYS``, or the workspace's
  entry in ``AUTOPLANE_RUN_RETENTION_DAYS_BY_WORKSPACE``; 0 keeps forever);
* it is final (succeeded, failed, cancelled, timed out): a queued, running, waiting,
  awaiting-approval or needs-attention run is never pruned, however old;
* it was created *and* finished before the cutoff;
* no approval of it is pending.

Its steps (with their outputs) and dispatch keys go with it, and re-runs of it keep
their own history with ``parent_run`` cleared. Each batch is one transaction holding
row locks on at most ``batch`` runs (taken with SKIP LOCKED, so a run some worker holds
is left for the next pass), and it writes its own ``history.pruned`` audit row: a crash
mid-batch rolls back that batch and its row together, and the next pass starts over
from what is left. The audit ledger itself is never pruned here (docs/audit.md).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, ApprovalStatus
from audit import writer
from workspaces.models import Workspace

from .models import FINAL_RUN_STATUSES, DispatchKey, Run, StepRun


@dataclass
class PruneResult:
    runs: int = 0
    steps: int = 0
    batches: int = 0
    by_workspace: dict[str, int] = field(default_factory=dict)
    finished: bool = True  # False when max_batches stopped the pass (runs may be left to prune)


def retention_days(workspace: Workspace) -> int:
    overrides = settings.AUTOPLANE_RUN_RETENTION_DAYS_BY_WORKSPACE
    return int(overrides.get(workspace.slug, settings.AUTOPLANE_RUN_RETENTION_DAYS))


def prunable_runs(workspace_id: int, cutoff):
    """The runs of a workspace that may go, oldest first (run_ws_created_idx, read backwards)."""
    pending = Approval.objects.filter(status=ApprovalStatus.PENDING).values("run_id")
    return (
        Run.objects.filter(
            workspace_id=workspace_id,
            status__in=FINAL_RUN_STATUSES,
            created_at__lt=cutoff,
            finished_at__lt=cutoff,
        )
        .exclude(pk__in=pending)
        .order_by("created_at", "id")
    )


def _prune_batch(workspace: Workspace, cutoff, days: int, batch: int) -> tuple[int, int]:
    with transaction.atomic():
        ids = list(
            prunable_runs(workspace.pk, cutoff)
            .select_for_update(skip_locked=True, of=("self",))
            .values_list("pk", flat=True)[:batch]
        )
        if not ids:
            return 0, 0
        # By ids, without Django's delete collector (which would read the runs back whole
        # and delete their steps a second time): first what points at the runs, then the runs.
        steps, _ = StepRun.objects.filter(run_id__in=ids).delete()
        DispatchKey.objects.filter(run_id__in=ids).delete()
        Run.objects.filter(parent_run_id__in=ids).exclude(pk__in=ids).update(parent_run=None)
        runs = Run.objects.filter(pk__in=ids)._raw_delete(Run.objects.db)
        writer.append(
            trace_id=uuid.uuid4().hex,
            type="history.pruned",
            summary=f"{runs} finished runs older than {days} days pruned, with {steps} steps",
            workspace_id=workspace.pk,
            payload={"runs": runs, "steps": steps, "retention_days": days, "cutoff": cutoff.isoformat()},
        )
        return runs, steps


def history_prune(*, batch: int | None = None, max_batches: int | None = None, now=None) -> PruneResult:
    """Delete the runs past each workspace's retention, ``batch`` runs per transaction."""
    batch = batch or settings.AUTOPLANE_RUN_RETENTION_BATCH
    now = now or timezone.now()
    result = PruneResult()
    for workspace in Workspace.objects.order_by("pk"):
        days = retention_days(workspace)
        if days <= 0:
            continue
        cutoff = now - timedelta(days=days)
        while True:
            if max_batches is not None and result.batches >= max_batches:
                result.finished = False
                return result
            runs, steps = _prune_batch(workspace, cutoff, days, batch)
            if not runs:
                break
            result.batches += 1
            result.runs += runs
            result.steps += steps
            result.by_workspace[workspace.slug] = result.by_workspace.get(workspace.slug, 0) + runs
    return result
