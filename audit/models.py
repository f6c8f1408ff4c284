"""The append-only, hash-chained audit ledger (SPEC §9).

Rows are written only by :mod:`audit.writer`. The database itself refuses
UPDATE and DELETE on ``audit_auditevent`` (triggers installed by migration 0002).
"""

from __future__ import annotations

from django.db import models


class Outcome(models.TextChoices):
    SUCCESS = "success"
    FAILURE = "failure"
    SUPPRESSED = "suppressed"
    INFO = "info"


class AuditEvent(models.Model):
    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    timestamp = models.DateTimeField()
    trace_id = models.CharField(max_length=64)
    stage = models.CharField(max_length=32, blank=True, default="")
    type = models.CharField(max_length=64)
    summary = models.CharField(max_length=500)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, default=Outcome.INFO)
    # No foreign keys: audit depends on no other app, and a ledger row must
    # outlive whatever it describes.
    workspace_id = models.BigIntegerField(null=True, blank=True)
    refs = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=200, default="system")
    payload = models.JSONField(default=dict, blank=True)
    prev_hash = models.CharField(max_length=64)
    hash = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["chain", "seq"], name="audit_event_chain_seq")]
        indexes = [
            models.Index(fields=["trace_id", "id"], name="audit_trace_idx"),
            models.Index(fields=["type", "id"], name="audit_type_idx"),
            models.Index(fields=["workspace_id", "id"], name="audit_workspace_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.chain}#{self.seq} {self.type}"


class AuditChainHead(models.Model):
    """The current head of one chain; appends lock this row, so a chain grows in one line."""

    chain = models.CharField(max_length=64, unique=True)
    seq = models.PositiveBigIntegerField(default=0)
    head_hash = models.CharField(max_length=64, default="0" * 64)
    # The head before the last append and that append's time: kept so that one
    # UPDATE ... RETURNING can hand both to the new event (PostgreSQL returns new
    # values only), and so timestamps never go backwards along a chain.
    prev_hash = models.CharField(max_length=64, default="0" * 64)
    last_timestamp = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.chain} @ {self.seq}"


class AuditCheckpoint(models.Model):
    """An Ed25519-signed statement of a chain's head, so a truncated tail is detectable."""

    chain = models.CharField(max_length=64)
    seq = models.PositiveBigIntegerField()
    head_hash = models.CharField(max_length=64)
    created_at = models.DateTimeField()
    key_id = models.CharField(max_length=64)
    signature = models.CharField(max_length=200)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["chain", "id"], name="audit_checkpoint_chain_idx")]

    def __str__(self) -> str:
        return f"checkpoint {self.chain}#{self.seq}"
