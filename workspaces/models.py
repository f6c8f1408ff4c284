"""Workspaces scope every object; members hold one role each.

Workspaces live in their own small app (below capabilities, approvals and the
engine) because credentials and approvals belong to a workspace too, and those
apps must not import the engine.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    VIEWER = "viewer"
    OPERATOR = "operator"
    APPROVER = "approver"
    ADMIN = "admin"


class Permission(models.TextChoices):
    VIEW = "view"
    OPERATE = "operate"  # run, cancel, edit
    APPROVE = "approve"  # approve / deny gated steps
    ADMINISTER = "administer"  # members, credentials, MCP servers, trust


ROLE_PERMISSIONS: dict[str, frozenset[str]] = {
    Role.VIEWER: frozenset({Permission.VIEW}),
    Role.OPERATOR: frozenset({Permission.VIEW, Permission.OPERATE}),
    Role.APPROVER: frozenset({Permission.VIEW, Permission.APPROVE}),
    Role.ADMIN: frozenset(Permission.values),
}


class Workspace(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Hosts/CIDRs http_request may reach even though they are private (SPEC §5).
    egress_allowlist = models.JSONField(default=list, blank=True)
    # Four-eyes: whoever triggered a run or last edited its automation cannot approve its steps.
    four_eyes = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["workspace", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} as {self.role}"
