"""Workspaces scope every object; members hold one role each.

Workspaces live in their own small app (below capabilities, approvals and the
engine) because credentials and approvals belong to a workspace too, and those
apps must not import the engine.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


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
DEFAULT_MAX_AUTONOMY = Autonomy.A3
DEFAULT_MIN_APPROVALS = 1
MAX_APPROVALS = 5


def effective_autonomy(own: str | None, default: str, ceiling: str) -> str:
    """A step's gate row: the definition's autonomy (else the workspace default), never above the
    workspace's ``max_autonomy`` (issue 29). Values are ``A0``..``A4``; lower is stricter."""
    wanted = own or default
    return min(wanted, ceiling or DEFAULT_MAX_AUTONOMY)  # "A0" < "A1" < ... < "A4"


def effective_quorum(required: int | None, minimum: int | None) -> int:
    """Distinct approvers a gated step needs: its own ``approvals_required``, never below the
    workspace's ``min_approvals``."""
    return max(int(required or 1), int(minimum or DEFAULT_MIN_APPROVALS), 1)


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
    # Ceilings (issue 29), set by the workspace's admins only and read at gate time: no step here is
    # gated above ``max_autonomy``, whatever its definition says, and none asks fewer than
    # ``min_approvals`` distinct approvers.
    max_autonomy = models.CharField(max_length=2, choices=Autonomy.choices, default=DEFAULT_MAX_AUTONOMY)
    min_approvals = models.PositiveSmallIntegerField(default=DEFAULT_MIN_APPROVALS)
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


class TokenScope(models.TextChoices):
    """What an API token may do on top of its user's roles (it never adds to them)."""

    FULL = "full", "full: everything the user's roles allow"
    MCP = "mcp", "mcp: look and run only (never approve, deny or administer)"


# The permissions each scope lets through; a token's permissions in a workspace are its user's
# role's permissions intersected with these.
SCOPE_PERMISSIONS: dict[str, frozenset[str]] = {
    TokenScope.FULL: frozenset(Permission.values),
    TokenScope.MCP: frozenset({Permission.VIEW, Permission.OPERATE}),
}


class ApiToken(models.Model):
    """An API token (``Authorization: Token <token>``): only its sha256 is stored.

    The token itself is shown once, when it is made; ``prefix`` (its first characters, not
    enough to use it) is what lists and the admin show to tell tokens apart.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)  # sha256 hex of the whole token
    prefix = models.CharField(max_length=16)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.FULL)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["user_id", "name"]
        verbose_name = "API token"
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="api_token_name_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…) of {self.user}"
