"""What needs an operator: the admin home page's counts and lists, scoped to the user's workspaces."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count
from django.utils import timezone

from approvals.models import Approval, ApprovalStatus
from audit.models import AuditCheckpoint
from automations import selectors as automation_selectors
from automations.models import Automation, Run, RunStatus
from config.celery import QUEUES
from notifications.models import Channel
from notifications.services import failing_channels
from workspaces.access import workspace_ids_for
from workspaces.models import Permission

from .selectors import workers_by_queue

WINDOW = timedelta(hours=24)


@dataclass(frozen=True)
class NeedsMe:
    pending_approvals: int
    failed_runs: int  # finished as failed in the last 24 h
    attention_runs: int  # needs_attention, created in the last 24 h


def needs_me(user) -> NeedsMe:
    approvals, runs = Approval.objects.all(), Run.objects.all()
    if not user.is_superuser:
        visible = workspace_ids_for(user, Permission.VIEW)  # ids, so the planner sees real numbers
        approvals, runs = approvals.filter(workspace__in=visible), runs.filter(workspace__in=visible)
    recent = runs.filter(created_at__gte=timezone.now() - WINDOW)
    return NeedsMe(
        pending_approvals=approvals.filter(status=ApprovalStatus.PENDING).count(),
        failed_runs=recent.filter(status=RunStatus.FAILED).count(),
        attention_runs=recent.filter(status=RunStatus.NEEDS_ATTENTION).count(),
    )


SHOWN = 5  # rows per list on the home page; each list links to the full one


@dataclass(frozen=True)
class QueueState:
    name: str
    workers: int
    queued_runs: int


@dataclass(frozen=True)
class Details:
    approvals_for_me: list[Approval] = field(default_factory=list)  # oldest first: they expire first
    recent_problems: list[Run] = field(default_factory=list)  # failed / needs_attention, last 24 h
    failing_automations: list[Automation] = field(default_factory=list)  # whose last run failed
    queues: list[QueueState] = field(default_factory=list)
    last_checkpoint_at: datetime | None = None
    failing_channels: list[Channel] = field(default_factory=list)  # notices kept failing (notifications/)
    # More than SHOWN medium-or-higher approvals wait: the home page says so (issue 30).
    risky_backlog: int = 0


def needs_me_details(user) -> Details:
    """A handful of rows per list; a bounded number of queries whatever the history's size."""
    approvals, runs, automations = Approval.objects.all(), Run.objects.all(), Automation.objects.all()
    approvable = Approval.objects.all()
    if not user.is_superuser:
        visible = workspace_ids_for(user, Permission.VIEW)
        approvals, runs = approvals.filter(workspace__in=visible), runs.filter(workspace__in=visible)
        automations = automations.filter(workspace__in=visible)
        approvable = approvals.filter(workspace__in=workspace_ids_for(user, Permission.APPROVE))
    mine = (approvable.filter(status=ApprovalStatus.PENDING, expires_at__gt=timezone.now())
            .exclude(decisions__user=user).order_by("created_at")[:SHOWN])  # fmt: skip
    problems = (runs.filter(status__in=[RunStatus.FAILED, RunStatus.NEEDS_ATTENTION],
                            created_at__gte=timezone.now() - WINDOW)
                .select_related("automation").order_by("-created_at")[:SHOWN])  # fmt: skip
    failing = (automation_selectors.with_last_run(automations)
               .filter(last_run_status__in=[RunStatus.FAILED, RunStatus.TIMED_OUT]).order_by("-last_run_at")[:SHOWN])  # fmt: skip
    queued = dict(
        Run.objects.filter(status=RunStatus.QUEUED).order_by().values_list("queue").annotate(n=Count("pk"))
    )
    workers = workers_by_queue(QUEUES)
    checkpoint = AuditCheckpoint.objects.order_by("-id").values_list("created_at", flat=True).first()
    channels = failing_channels(None if user.is_superuser else workspace_ids_for(user, Permission.VIEW))
    risky = approvals.filter(status=ApprovalStatus.PENDING, risk__in=["medium", "high", "critical"]).count()
    return Details(
        failing_channels=list(channels[:SHOWN]), risky_backlog=risky if risky > SHOWN else 0,
        approvals_for_me=list(mine), recent_problems=list(problems), failing_automations=list(failing),
        queues=[QueueState(q, workers.get(q, 0), queued.get(q, 0)) for q in QUEUES], last_checkpoint_at=checkpoint,
    )  # fmt: skip
