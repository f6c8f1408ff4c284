from __future__ import annotations

from rest_framework.exceptions import PermissionDenied

from workspaces.access import has_permission


def require(user, workspace_id: int, permission: str) -> None:
    """Members without the permission get 403 (non-members never see the object: 404)."""
    if not has_permission(user, workspace_id, permission):
        raise PermissionDenied(f"your role in this workspace does not allow '{permission}'")
