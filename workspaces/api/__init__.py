"""What every API (REST and MCP) asks of workspaces: may this user do this here, and where does a new
object go. Refusals are ``ServiceError``s, so any surface turns them into its own error shape."""

from __future__ import annotations

from config.errors import ServiceError

from ..access import default_workspace_for, has_permission, may_act, workspaces_for
from ..models import Permission, Workspace


def require(user, workspace_id: int, permission: str) -> None:
    """Members without the permission get 403 (non-members never see the object: 404)."""
    if not has_permission(user, workspace_id, permission):
        raise ServiceError(
            "PERMISSION_DENIED", f"your role in this workspace does not allow '{permission}'", 403
        )


def require_or_superuser(user, workspace_id: int, permission: str) -> None:
    """The admin's check: a superuser may act anywhere (the admin shows them every workspace)."""
    if not may_act(user, workspace_id, permission):
        raise ServiceError(
            "PERMISSION_DENIED", f"your role in this workspace does not allow '{permission}'", 403
        )


def workspace_for(user, slug: str | None, permission: str) -> Workspace:
    """The workspace named by ``slug``, or the user's only one where they hold ``permission``."""
    if slug:
        workspace = workspaces_for(user, Permission.VIEW).filter(slug=slug).first()
        if workspace is None:
            raise ServiceError("NOT_FOUND", "workspace not found", 404)
        require(user, workspace.id, permission)
        return workspace
    workspace = default_workspace_for(user, permission)
    if workspace is None:
        raise ServiceError(
            "INVALID_ARGUMENT", f"name the workspace: you have '{permission}' in none or in several"
        )
    return workspace


def workspace_for_write(request, slug: str | None, permission: str) -> Workspace:
    return workspace_for(request.user, slug, permission)
