"""Reads, always scoped to what the user may see."""

from __future__ import annotations

from django.db.models import QuerySet

from workspaces.access import workspaces_for
from workspaces.models import Permission

from .models import Trigger


def triggers_visible_to(user) -> QuerySet[Trigger]:
    return Trigger.objects.filter(workspace__in=workspaces_for(user, Permission.VIEW)).select_related(
        "automation"
    )


def triggers_of_automation(user, automation_id) -> QuerySet[Trigger]:
    return triggers_visible_to(user).filter(automation_id=automation_id).order_by("key")
