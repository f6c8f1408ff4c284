"""Liveness of the platform's processes, read by ``/healthz`` and ``/metrics``."""

from __future__ import annotations

from django.db import models


class HeartbeatKind(models.TextChoices):
    WORKER = "worker"  # a Celery worker: one row per node name, lists its queues
    BEAT = "beat"  # the Celery beat process itself, while its scheduler loop ticks
    TICK = "tick"  # the last autoplane.beat_heartbeat executed: beat -> broker -> worker works


class Heartbeat(models.Model):
    """The last sign of life of one process; a row older than ``STALE_AFTER`` counts as absent."""

    name = models.CharField(max_length=255, unique=True)
    kind = models.CharField(max_length=16, choices=HeartbeatKind.choices)
    queues = models.JSONField(default=list, blank=True)
    hostname = models.CharField(max_length=255, blank=True, default="")
    pid = models.IntegerField(null=True, blank=True)
    started_at = models.DateTimeField()
    seen_at = models.DateTimeField()

    class Meta:
        ordering = ["kind", "name"]
        indexes = [models.Index(fields=["kind", "seen_at"], name="heartbeat_kind_seen_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"
