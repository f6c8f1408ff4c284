"""Reads, always scoped to what the user may see."""

from __future__ import annotations

import difflib
import json
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict

from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from workspaces.access import workspace_ids_for, workspaces_for
from workspaces.models import Permission, Workspace, effective_autonomy

from .models import Automation, AutomationVersion, Run

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations


def automations_visible_to(user) -> QuerySet[Automation]:
    return Automation.objects.filter(workspace__in=workspaces_for(user, Permission.VIEW)).select_related(
        "workspace"
    )


def definition_autonomy(definition: Any, workspace: Workspace) -> str:
    """The autonomy its steps are gated at now: the definition's (else the workspace default),
    never above the workspace's ``max_autonomy`` (what the worker computes at gate time)."""
    execution = (definition.get("execution") if isinstance(definition, dict) else None) or {}
    own = execution.get("autonomy") if isinstance(execution, dict) else None
    return effective_autonomy(own, workspace.default_autonomy, workspace.max_autonomy)


def ceiling_notices(definition: Any, workspace: Workspace) -> list[dict[str, str]]:
    """What the workspace's ceilings change about this definition (it saves as written: definitions are
    portable; the gate applies the ceilings when it runs). Empty when they change nothing."""
    notices: list[dict[str, str]] = []
    execution = (definition.get("execution") if isinstance(definition, dict) else None) or {}
    own = execution.get("autonomy") if isinstance(execution, dict) else None
    effective = definition_autonomy(definition, workspace)
    if own and effective != own:
        notices.append({
            "code": "autonomy_clamped", "path": "/execution/autonomy",
            "message": f"autonomy {own} is above this workspace's max_autonomy {workspace.max_autonomy}: "
                       f"its steps are gated at {effective}",
        })  # fmt: skip
    elif not own and effective != workspace.default_autonomy:
        notices.append({
            "code": "autonomy_clamped", "path": "/execution/autonomy",
            "message": f"the workspace default autonomy {workspace.default_autonomy} is above its max_autonomy "
                       f"{workspace.max_autonomy}: its steps are gated at {effective}",
        })  # fmt: skip
    if workspace.min_approvals > 1:
        notices.append({
            "code": "approvals_raised", "path": "/plan",
            "message": f"every gated step here needs at least {workspace.min_approvals} distinct approvers "
                       "(the workspace's min_approvals)",
        })  # fmt: skip
    return notices


def automations_listed_for(user, *, archived: bool = False) -> QuerySet[Automation]:
    """The automations a list shows: live ones, or with ``archived`` only the archived ones."""
    return automations_visible_to(user).filter(archived_at__isnull=not archived)


def runs_visible_to(user) -> QuerySet[Run]:
    return (
        Run.objects.filter(workspace_id__in=workspace_ids_for(user, Permission.VIEW))
        .select_related("workspace", "automation")
        .order_by("-created_at", "-id")
    )


def run_with_steps(run: Run) -> list:
    """Step rows in plan order: one per step of the plan, then the on_failure steps that ran."""
    return list(run.steps.order_by("-phase", "index")) if run.pk else []


def automation_workspace_and_editor(automation_id) -> tuple[int, int | None, int] | None:
    """``(workspace id, last definition editor id, current version)`` of an automation, None if there
    is none with that id."""
    row = (
        Automation.objects.filter(pk=automation_id)
        .values_list("workspace_id", "updated_by_id", "version")
        .first()
    )
    return (row[0], row[1], row[2]) if row else None


class LastRun(TypedDict):
    last_run_status: str | None
    last_run_at: datetime | None
    runs_24h: int


def with_last_run(automations: QuerySet[Automation]) -> QuerySet[WithAnnotations[Automation, LastRun]]:
    """Each automation's last run (status, time) and its runs in the last 24 h, in the same query.

    Three correlated subqueries, each an index range on ``run_automation_idx``
    (automation, -created_at): the cost grows with the page, not with the table.
    """
    runs = Run.objects.filter(automation=OuterRef("pk")).order_by("-created_at")
    recent = (
        Run.objects.filter(automation=OuterRef("pk"), created_at__gte=timezone.now() - timedelta(hours=24))
        .order_by()
        .values("automation")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return automations.annotate(
        last_run_status=Subquery(runs.values("status")[:1]),
        last_run_at=Subquery(runs.values("created_at")[:1]),
        runs_24h=Coalesce(Subquery(recent, output_field=IntegerField()), Value(0)),
    )


def _pretty_lines(definition: Any) -> list[str]:
    return json.dumps(definition, indent=2, ensure_ascii=False, sort_keys=True).splitlines(keepends=True)


def definition_diff(before: Any, after: Any, before_label: str, after_label: str) -> str:
    return "".join(
        difflib.unified_diff(_pretty_lines(before), _pretty_lines(after), before_label, after_label)
    )


def version_history(automation: Automation, limit: int = 20) -> list[tuple[AutomationVersion, str]]:
    """The latest ``limit`` versions, newest first, each with its diff from the version before it."""
    versions = list(automation.versions.select_related("created_by").order_by("-version")[: limit + 1])
    history: list[tuple[AutomationVersion, str]] = []
    for newer, older in zip(versions, [*versions[1:], None], strict=True):
        if len(history) == limit:
            break
        diff = (
            definition_diff(
                older.definition, newer.definition, f"version {older.version}", f"version {newer.version}"
            )
            if older is not None
            else ""
        )
        history.append((newer, diff))
    return history


def recent_runs(automation: Automation, limit: int = 10) -> list[Run]:
    return list(automation.runs.order_by("-created_at")[:limit])
