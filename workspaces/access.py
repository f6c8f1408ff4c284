"""Who may do what where: every API query and action goes through these."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import ROLE_PERMISSIONS, SCOPE_PERMISSIONS, Membership, Permission, Workspace


def scope_allows(user, permission: str) -> bool:
    """Whether the token the user came with (if any) lets ``permission`` through: a token scoped
    ``mcp`` never approves or administers, whatever the user's role (``api_tokens``)."""
    scope = getattr(user, "api_token_scope", None)
    return scope is None or permission in SCOPE_PERMISSIONS.get(scope, frozenset())


def workspaces_for(user, permission: str = Permission.VIEW) -> QuerySet[Workspace]:
    if not user or not user.is_authenticated or not scope_allows(user, permission):
        return Workspace.objects.none()
    roles = [role for role, perms in ROLE_PERMISSIONS.items() if permission in perms]
    return Workspace.objects.filter(memberships__user=user, memberships__role__in=roles)


def workspace_ids_for(user, permission: str = Permission.VIEW) -> list[int]:
    """The ids of ``workspaces_for``, resolved now: a concrete ``IN (1, 2, 3)`` lets the
    planner estimate a big table's rows per workspace, where a subquery leaves it guessing."""
    return list(workspaces_for(user, permission).values_list("id", flat=True))


def has_permission(user, workspace_id: int, permission: str) -> bool:
    if not user or not user.is_authenticated or not scope_allows(user, permission):
        return False
    role = (
        Membership.objects.filter(user=user, workspace_id=workspace_id).values_list("role", flat=True).first()
    )
    return role is not None and permission in ROLE_PERMISSIONS[role]


def may_act(user, workspace_id: int, permission: str) -> bool:
    """The admin's question: a superuser may act in every workspace (the admin shows them all)."""
    if not scope_allows(user, permission):
        return False
    return bool(getattr(user, "is_superuser", False)) or has_permission(user, workspace_id, permission)


def default_workspace_for(user, permission: str = Permission.OPERATE) -> Workspace | None:
    """The caller's only workspace with ``permission``; None when ambiguous or absent."""
    candidates = list(workspaces_for(user, permission)[:2])
    return candidates[0] if len(candidates) == 1 else None
