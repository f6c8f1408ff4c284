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


class Autonomy(models.TextChoices):
    """The gate matrix's rows (SPEC §7.3): how much an automation may do without a human."""

    A0 = "A0", "A0: preview everything"
    A1 = "A1", "A1: confirm every step, block critical"
    A2 = "A2", "A2: allow low risk, confirm medium and high"
    A3 = "A3", "A3: allow up to medium, confirm high"
    A4 = "A4", "A4: allow up to high, confirm critical"


DEFAULT_AUTONOMY = Autonomy.A3


class Workspace(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    # Hosts/CIDRs http_request may reach even though they are private (SPEC §5).
    egress_allowlist = models.JSONField(default=list, blank=True)
    # Four-eyes: whoever triggered a run or last edited its automation cannot approve its steps.
    four_eyes = models.BooleanField(default=False)
    # The gate row of every automation here whose definition sets no execution.autonomy, read
    # when a worker gates a step (docs/concepts.md), so a change reaches them without a re-save.
    default_autonomy = models.CharField(max_length=2, choices=Autonomy.choices, default=DEFAULT_AUTONOMY)
    # Argument policies (docs/concepts.md): ordered rules {when, then: auto|ask|block, reason} over a
    # step's rendered config, first match wins; admin-only, checked when saved.
    policies = models.JSONField(default=list, blank=True)
    # {"start": "HH:MM", "end": "HH:MM", "timezone": IANA}: medium and higher risk steps ask inside it.
    quiet_hours = models.JSONField(null=True, blank=True, default=None)
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
