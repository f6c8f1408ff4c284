"""Reads, always scoped to what the user may see."""

from __future__ import annotations

from django.db.models import QuerySet

from workspaces.access import workspace_ids_for, workspaces_for
from workspaces.models import Permission

from .models import Automation, Run


def automations_visible_to(user) -> QuerySet[Automation]:
    return Automation.objects.filter(workspace__in=workspaces_for(user, Permission.VIEW)).select_related(
        "workspace"
    )


def runs_visible_to(user) -> QuerySet[Run]:
    return (
        Run.objects.filter(workspace_id__in=workspace_ids_for(user, Permission.VIEW))
        .select_related("workspace", "automation")
        .order_by("-created_at", "-id")
    )


def run_with_steps(run: Run) -> list:
    """Step rows in plan order: one per step of the plan, then the on_failure steps that ran."""
    return list(run.steps.order_by("-phase", "index")) if run.pk else []


def automation_workspace_and_editor(automation_id) -> tuple[int, int | None] | None:
    """``(workspace id, last editor id)`` of an automation, None if there is none with that id."""
    row = Automation.objects.filter(pk=automation_id).values_list("workspace_id", "updated_by_id").first()
    return (row[0], row[1]) if row else None
