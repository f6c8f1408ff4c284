"""Writes for workspaces and memberships; each change is audited in its transaction."""

from __future__ import annotations

import uuid

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework.authtoken.models import Token

from audit import writer

from .models import Membership, Role, Workspace


def _trace() -> str:
    return uuid.uuid4().hex


@transaction.atomic
def workspace_get_or_create(*, slug: str, name: str = "", actor: str = "system") -> Workspace:
    workspace, created = Workspace.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    if created:
        writer.append(
            trace_id=_trace(), type="workspace.created", summary=f"workspace {slug} created",
            workspace_id=workspace.id, actor=actor, refs={"workspace": workspace.slug},
        )  # fmt: skip
    return workspace


@transaction.atomic
def membership_set_role(*, workspace: Workspace, user, role: str, actor: str = "system") -> Membership:
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}")
    membership, created = Membership.objects.get_or_create(
        workspace=workspace, user=user, defaults={"role": role}
    )
    previous = None if created else membership.role
    if previous != role:
        if not created:
            membership.role = role
            membership.save(update_fields=["role"])
        writer.append(
            trace_id=_trace(), type="operator.membership.role_changed",
            summary=f"{user.get_username()} is {role} in {workspace.slug}",
            workspace_id=workspace.id, actor=actor,
            payload={"user": user.get_username(), "role": role, "previous_role": previous},
        )  # fmt: skip
    return membership


@transaction.atomic
def api_token_create(*, username: str, workspace_slug: str, role: str, actor: str = "system") -> str:
    """Create the user, workspace and membership if missing; return a fresh API token."""
    user, _ = get_user_model().objects.get_or_create(username=username)
    workspace = workspace_get_or_create(slug=workspace_slug, actor=actor)
    membership_set_role(workspace=workspace, user=user, role=role, actor=actor)
    Token.objects.filter(user=user).delete()
    token = Token.objects.create(user=user)
    writer.append(
        trace_id=_trace(), type="operator.api_token.created", summary=f"API token created for {username}",
        workspace_id=workspace.id, actor=actor, payload={"user": username}, secrets=[token.key],
    )  # fmt: skip
    return token.key
