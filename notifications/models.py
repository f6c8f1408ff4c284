"""Notification channels and deliveries (issue 30): how approvers are told that a decision waits.

``notifications`` sits between ``approvals`` and the engine: it reads approvals and
members, the engine tells it when an approval is requested (``automations.gating``).
A channel's secrets (a Slack incoming-webhook URL, a webhook's signing secret) are
stored encrypted with the credential keys (``capabilities.credentials``).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from approvals.models import Approval
from workspaces.models import Workspace

# A channel whose last deliveries kept failing this many times in a row is shown as failing.
FAILING_AFTER = 3


class ChannelKind(models.TextChoices):
    EMAIL = "email"
    SLACK = "slack"
    WEBHOOK = "webhook"


class Channel(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="channels")
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    name = models.CharField(max_length=100)
    to = models.JSONField(
        default=list, blank=True, help_text="email: addresses and/or role:approver, role:admin"
    )
    url = models.CharField(
        max_length=2000, blank=True, default="", help_text="webhook: where the signed JSON is POSTed"
    )
    # Fernet over JSON: slack {"url": ...}; webhook {"secret": "whsec_..."}.
    secret_encrypted = models.TextField(blank=True, default="", editable=False)
    enabled = models.BooleanField(default=True)
    consecutive_failures = models.PositiveIntegerField(default=0, editable=False)
    last_error = models.TextField(blank=True, default="", editable=False)
    last_failure_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_success_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["workspace_id", "name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="channel_name_unique")]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= FAILING_AFTER


class Notice(models.TextChoices):
    REQUESTED = "requested"
    REMINDER = "reminder"
    ESCALATION = "escalation"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"  # queued or between retries
    DELIVERED = "delivered"
    FAILED = "failed"  # out of attempts, or refused (egress guard)
    SKIPPED = "skipped"  # the approval was decided first, or the recipient may no longer decide


class Delivery(models.Model):
    """One notice to one destination: a channel (a Slack or webhook post), or one e-mail address."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    approval = models.ForeignKey(Approval, on_delete=models.CASCADE, related_name="+")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    channel = models.ForeignKey(
        Channel, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries"
    )
    kind = models.CharField(max_length=16, choices=ChannelKind.choices)
    address = models.CharField(max_length=320, blank=True, default="")  # email
    # The member the e-mail is for: they get a one-click link of their own, minted at send time.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    notice = models.CharField(max_length=16, choices=Notice.choices)
    sequence = models.PositiveIntegerField(default=0)  # which reminder
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "deliveries"
        indexes = [models.Index(fields=["approval", "notice"], name="delivery_approval_idx")]
        constraints = [
            models.UniqueConstraint(
                fields=["approval", "channel", "address", "notice", "sequence"], name="delivery_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.notice} via {self.kind} {self.address or self.channel_id} ({self.status})"


class ApprovalWatch(models.Model):
    """What to do about one pending approval over time: who else to tell, when to remind, escalate."""

    approval = models.OneToOneField(Approval, primary_key=True, on_delete=models.CASCADE, related_name="+")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    notify = models.JSONField(default=list, blank=True)
    remind_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    remind_every_seconds = models.PositiveIntegerField(null=True, blank=True)
    escalate_after_seconds = models.PositiveIntegerField(null=True, blank=True)
    escalate_to = models.JSONField(default=list, blank=True)
    reminders_sent = models.PositiveIntegerField(default=0)
    last_reminded_at = models.DateTimeField(null=True, blank=True)
    escalated_at = models.DateTimeField(null=True, blank=True)
    # Set once the approval is no longer pending: the sweep stops looking at it.
    closed = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["closed", "created_at"], name="watch_open_idx")]

    def __str__(self) -> str:
        return f"watch {self.approval_id}"
