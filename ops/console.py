"""What needs an operator: the counts on the admin home page, scoped to the user's workspaces."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from approvals.models import Approval, ApprovalStatus
from automations.models import Run, RunStatus
from workspaces.access import workspaces_for
from workspaces.models import Permission

WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class NeedsMe:
    pending_approvals: int
    failed_runs: int  # finished as failed in the last 24 h
    attention_runs: int  # needs_attention, created in the last 24 h


def needs_me(user) -> NeedsMe:
    approvals, runs = Approval.objects.all(), Run.objects.all()
    if not user.is_superuser:
        visible = workspaces_for(user, Permission.VIEW).values("id")
        approvals, runs = approvals.filter(workspace__in=visible), runs.filter(workspace__in=visible)
    recent = runs.filter(created_at__gte=timezone.now() - WINDOW)
    return NeedsMe(
        pending_approvals=approvals.filter(status=ApprovalStatus.PENDING).count(),
        failed_runs=recent.filter(status=RunStatus.FAILED).count(),
        attention_runs=recent.filter(status=RunStatus.NEEDS_ATTENTION).count(),
    )
