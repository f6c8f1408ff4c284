"""Approvals (SPEC §7.3): requests bound to a plan hash, decisions, consumed nonces, standing approvals.

``approvals`` knows runs only as opaque ids: there are deliberately no foreign
keys to the engine's tables.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from workspaces.models import Workspace


class ApprovalStatus(models.TextChoices):
    PENDING = "pending"
    APPROVED = "approved"  # quorum reached, token minted, not yet used by the executor
    DENIED = "denied"
    EXPIRED = "expired"
    CONSUMED = "consumed"  # the executor verified the token and consumed its nonce
    INVALIDATED = "invalidated"  # superseded (plan changed) or its token failed verification


# At most one approval per step of a run may still lead to execution.
LIVE_STATUSES = (ApprovalStatus.PENDING, ApprovalStatus.APPROVED)


class Approval(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="approvals")
    run_id = models.UUIDField(db_index=True)
    automation_id = models.UUIDField()
    automation_name = models.CharField(max_length=200, blank=True, default="")
    step_key = models.CharField(max_length=120, help_text="<phase>:<index>:<step_id>, unique within the run")
    step_id = models.CharField(max_length=64)
    action = models.CharField(max_length=64)
    capability_id = models.CharField(max_length=200)
    risk = models.CharField(max_length=16)
    reasons = models.JSONField(default=list, blank=True)
    what = models.JSONField(help_text="The exact rendered payload that will run (secrets redacted).")
    why = models.TextField(blank=True, default="")
    message = models.TextField(blank=True, default="")
    plan_hash = models.CharField(max_length=64)
    requested_by = models.CharField(max_length=200, default="system")
    # Who last edited the automation when the approval was requested (four-eyes).
    last_editor_id = models.BigIntegerField(null=True, blank=True)
    # The people behind the run (user ids): four-eyes refuses their decisions too.
    principal_ids = models.JSONField(default=list, blank=True)
    trace_id = models.CharField(max_length=64)
    status = models.CharField(max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING)
    approvals_required = models.PositiveSmallIntegerField(default=1)
    expires_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    # When the executor acted on the decision (consumed the token, recorded the
    # denial or expiry); until then the expiry sweep nudges the run again.
    settled_at = models.DateTimeField(null=True, blank=True)
    token = models.TextField(
        blank=True, default="", help_text="The signed approval token, once the quorum is reached."
    )
    # ask_human: {value, freetext, decided_by, timed_out} once answered (or timed out).
    answer = models.JSONField(null=True, blank=True)
    # Edit-then-approve: the whole config an approver wrote in place of the rendered one. The step runs
    # it exactly (``plan_hash`` and the token are bound to it); a re-render never replaces it.
    edited_config = models.JSONField(null=True, blank=True)
    edited_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["run_id", "step_key", "-created_at"], name="approval_run_step_idx"),
            models.Index(fields=["workspace", "status", "-created_at"], name="approval_ws_status_idx"),
            models.Index(fields=["status", "expires_at"], name="approval_status_expiry_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["run_id", "step_key"],
                condition=Q(status__in=["pending", "approved"]),
                name="approval_one_live_per_step",
            )
        ]

    def __str__(self) -> str:
        return f"{self.automation_name}: {self.step_id} ({self.status})"


class Decision(models.TextChoices):
    APPROVE = "approve"
    DENY = "deny"
    ANSWER = "answer"  # an ask_human question answered


class ApprovalDecision(models.Model):
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="decisions")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    decision = models.CharField(max_length=8, choices=Decision.choices)
    reason = models.TextField(blank=True, default="")
    via = models.CharField(max_length=16, default="api")  # api | admin | link
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at"]
        constraints = [
            models.UniqueConstraint(fields=["approval", "user"], name="approval_decision_one_per_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} {self.decision}s {self.approval_id}"


class ConsumedNonce(models.Model):
    """A nonce that has been used. Consuming is an INSERT: a unique violation means a replay."""

    nonce = models.CharField(max_length=128, unique=True)
    approval_id = models.UUIDField()
    consumed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.nonce


class StandingApproval(models.Model):
    """Pre-authorises one capability for one automation version, bounded by uses, expiry and an argument schema.

    ``signature`` is Ed25519 over the bounds (see ``approvals.tokens.standing_bytes``),
    so widening them with a database edit makes the row unusable. ``uses`` and
    ``revoked`` are state, not bounds: they only ever narrow what the row allows.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="standing_approvals")
    automation_id = models.UUIDField()
    capability_id = models.CharField(max_length=200)
    max_uses = models.PositiveIntegerField()
    uses = models.PositiveIntegerField(default=0)
    expires_at = models.DateTimeField()
    arg_constraint = models.JSONField(
        null=True, blank=True, help_text="JSON Schema the step's rendered config must match (null: any)."
    )
    reason = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The automation version it was granted for (signed): it covers runs of that version only, so an
    # edit of the automation voids it for the new version. Null: granted before this binding; void.
    automation_version = models.PositiveIntegerField(null=True, blank=True)
    revoked = models.BooleanField(default=False)
    revoked_at = models.DateTimeField(null=True, blank=True)
    key_id = models.CharField(max_length=64, blank=True, default="")
    signature = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["workspace", "automation_id", "capability_id"], name="standing_lookup_idx"),
        ]

    def __str__(self) -> str:
        return f"standing {self.capability_id} for {self.automation_id} ({self.uses}/{self.max_uses})"
