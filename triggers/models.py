"""Triggers (SPEC §6): one row per trigger in an automation's definition, synced on save.

A trigger keeps its identity (and its webhook token) per ``key`` across edits
of the definition; ``triggers.services.triggers_sync`` is the only writer of
the definition-derived columns.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models
from django_celery_beat.models import PeriodicTask

from automations.models import Automation
from workspaces.models import Workspace


class TriggerType(models.TextChoices):
    SCHEDULE = "schedule"
    WEBHOOK = "webhook"
    EVENT = "event"


class Trigger(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    automation = models.ForeignKey(Automation, on_delete=models.CASCADE, related_name="triggers")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=64)
    type = models.CharField(max_length=16, choices=TriggerType.choices)
    config = models.JSONField(default=dict, blank=True)
    # sha256 of the canonical config: compiled event filters are cached under (id, config_hash).
    config_hash = models.CharField(max_length=64, blank=True, default="")
    # False while the automation is paused or the definition says "enabled": false.
    enabled = models.BooleanField(default=True)
    # Webhook bearer token: only its sha256 (hex) is stored; the token is shown once.
    token_hash = models.CharField(max_length=64, null=True, blank=True, unique=True)
    token_created_at = models.DateTimeField(null=True, blank=True)
    token_revoked_at = models.DateTimeField(null=True, blank=True)
    # Who rotated the current token in: a fire with it is their doing, for four-eyes.
    token_rotated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Standard Webhooks signing secret ("whsec_..."), Fernet-encrypted like credentials.
    signing_secret_encrypted = models.TextField(blank=True, default="")
    signing_secret_created_at = models.DateTimeField(null=True, blank=True)
    last_fired_at = models.DateTimeField(null=True, blank=True)
    # Schedules: the latest slot accounted for (fired, caught up or reported missed).
    # Slots after it and before the current one were missed (SPEC §6.1 catch_up).
    last_scheduled_for = models.DateTimeField(null=True, blank=True)
    periodic_task = models.OneToOneField(
        PeriodicTask, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # An indexed copy of config.event_type ("" for other types): an event is only
    # tested against the triggers subscribed to its type in its workspace.
    event_type = models.CharField(max_length=128, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["automation", "key"]
        constraints = [
            models.UniqueConstraint(fields=["automation", "key"], name="trigger_automation_key_unique")
        ]
        indexes = [models.Index(fields=["workspace", "event_type"], name="trigger_event_subscribers_idx")]

    def __str__(self) -> str:
        return f"{self.key} ({self.type})"

    @property
    def has_token(self) -> bool:
        return bool(self.token_hash) and self.token_revoked_at is None

    @property
    def has_signing_secret(self) -> bool:
        return bool(self.signing_secret_encrypted)


class WebhookRateWindow(models.Model):
    """Fire attempts of one webhook trigger in one fixed one-minute window.

    Incremented with a single ``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``
    (PostgreSQL, and SQLite >= 3.35), so the count is exact across processes.
    Windows older than the previous one are deleted when a new window starts.
    """

    trigger = models.ForeignKey(Trigger, on_delete=models.CASCADE, related_name="+")
    window_start = models.BigIntegerField(help_text="minutes since the Unix epoch")
    hits = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["trigger", "window_start"], name="webhook_rate_window_unique")
        ]

    def __str__(self) -> str:
        return f"{self.trigger_id}@{self.window_start}: {self.hits}"


class WebhookRejectionWindow(models.Model):
    """Rejected webhook fires counted per subject in one fixed window (see :mod:`triggers.rejections`).

    Subjects: ``addr:<client address>`` and ``automation:<id>`` count failed
    authentications (the failed-auth limiter); ``ledger:<automation id or ->``
    counts every rejection, for the ledger's per-window summary. Incremented with
    one atomic upsert; ``summarized_at`` is set when the window's summary row was
    written to the ledger (the audit row itself is never updated).
    """

    subject = models.CharField(max_length=100)
    window_start = models.BigIntegerField(help_text="window number: Unix seconds // window length")
    count = models.PositiveIntegerField(default=0)
    workspace = models.ForeignKey(
        Workspace, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    summarized_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["subject", "window_start"], name="webhook_rejection_window_unique"
            )
        ]
        indexes = [models.Index(fields=["window_start"], name="webhook_rejection_window_idx")]

    def __str__(self) -> str:
        return f"{self.subject}@{self.window_start}: {self.count}"
