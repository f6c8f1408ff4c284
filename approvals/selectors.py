"""Reads for approvals, scoped to what a user may see."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from workspaces.access import workspaces_for
from workspaces.models import Permission

from .models import Approval, ApprovalStatus, Decision, StandingApproval


def with_counts(approvals: QuerySet[Approval]) -> QuerySet[Approval]:
    return approvals.annotate(
        approvals_count=Count("decisions", filter=Q(decisions__decision=Decision.APPROVE))
    )


def approvals_visible_to(user, status: str | None = None) -> QuerySet[Approval]:
    approvals = Approval.objects.filter(workspace__in=workspaces_for(user, Permission.VIEW).values("id"))
    if status:
        approvals = approvals.filter(status=status)
    return with_counts(approvals).order_by("-created_at", "id")


def pending_count(user) -> int:
    if getattr(user, "is_superuser", False):
        return Approval.objects.filter(status=ApprovalStatus.PENDING).count()
    return approvals_visible_to(user, ApprovalStatus.PENDING).count()


def standing_approvals_visible_to(user) -> QuerySet[StandingApproval]:
    visible = workspaces_for(user, Permission.VIEW).values("id")
    return StandingApproval.objects.filter(workspace__in=visible).order_by("-created_at", "id")


def answer_for(run_id, step_id: str) -> dict | None:
    """The answer to a run's ``ask_human`` step (the latest approval of that step that has one)."""
    return (
        Approval.objects.filter(run_id=run_id, step_id=step_id, answer__isnull=False)
        .order_by("-created_at").values_list("answer", flat=True).first()
    )  # fmt: skip


def edited_config(run_id, step_key: str):
    """The config an approver put in place of this step's rendered one (edit-then-approve), or None.

    Read from the step's latest approval: once edited, the step runs the edit (or asks again about
    it), never a fresh render of the original."""
    return (
        Approval.objects.filter(run_id=run_id, step_key=step_key, edited_config__isnull=False)
        .order_by("-created_at")
        .values_list("edited_config", flat=True)
        .first()
    )
