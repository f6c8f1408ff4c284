"""``manage.py check --deploy`` (and ``doctor``): four-eyes off where two people could decide.

Four-eyes is off by default: a trial install has one person, who must be able to approve
their own runs. Once a workspace has two or more people who may decide approvals (admins
and approvers), letting the person behind a run approve it is a choice to make on purpose.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.db import DatabaseError
from django.db.models import Count, Q

from .models import Role, Workspace

DECIDERS = (Role.ADMIN, Role.APPROVER)


def workspaces_without_four_eyes() -> list[str]:
    """Slugs of the workspaces with four-eyes off and at least two admins or approvers."""
    return list(
        Workspace.objects.filter(four_eyes=False)
        .annotate(deciders=Count("memberships", filter=Q(memberships__role__in=DECIDERS)))
        .filter(deciders__gte=2)
        .order_by("slug")
        .values_list("slug", flat=True)
    )


@checks.register(checks.Tags.security, deploy=True)
def four_eyes_check(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        slugs = workspaces_without_four_eyes()
    except DatabaseError:  # no tables yet: nothing to say
        return []
    if not slugs:
        return []
    listed = ", ".join(slugs[:10]) + (f" and {len(slugs) - 10} more" if len(slugs) > 10 else "")
    return [
        checks.Warning(
            f"four-eyes is off in workspace(s) with two or more admins/approvers: {listed}; "
            "the person behind a run (or its automation's last editor) can approve its steps",
            hint='turn it on: PATCH /api/v1/workspaces/<slug> {"four_eyes": true} or the workspace admin page '
            "(docs/security.md, Four-eyes)",
            id="workspaces.W001",
        )
    ]
