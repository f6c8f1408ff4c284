"""What every API view asks of workspaces: may this user do this here, and where does a new object go."""

from __future__ import annotations

from rest_framework.exceptions import NotFound, PermissionDenied

from config.errors import ServiceError

from .access import default_workspace_for, has_permission, workspaces_for
from .models import Permission, Workspace


def require(user, workspace_id: int, permission: str) -> None:
    """Members without the permission get 403 (non-members never see the object: 404)."""
    if not has_permission(user, workspace_id, permission):
        raise PermissionDenied(f"your role in this workspace does not allow '{permission}'")


def workspace_for_write(request, slug: str | None, permission: str) -> Workspace:
    """The workspace named by ``slug``, or the caller's only one where they hold ``permission``."""
    if slug:
        workspace = workspaces_for(request.user, Permission.VIEW).filter(slug=slug).first()
        if workspace is None:
            raise NotFound("workspace not found")
        require(request.user, workspace.id, permission)
        return workspace
    workspace = default_workspace_for(request.user, permission)
    if workspace is None:
        raise ServiceError(
            "INVALID_ARGUMENT", f"name the workspace: you have '{permission}' in none or in several"
        )
    return workspace
