"""Reads of process liveness."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from django.utils import timezone

from .models import Heartbeat, HeartbeatKind

# Processes write every HEARTBEAT_INTERVAL seconds; a row this old means the
# process is gone (or wedged), whatever it last said.
HEARTBEAT_INTERVAL = 5.0
STALE_AFTER = timedelta(seconds=30)


def heartbeats_fresh(*, kind: str) -> QuerySet[Heartbeat]:
    return Heartbeat.objects.filter(kind=kind, seen_at__gte=timezone.now() - STALE_AFTER)


def workers_by_queue(queues: tuple[str, ...] | list[str]) -> dict[str, int]:
    """How many live workers consume each of ``queues``."""
    counts = dict.fromkeys(queues, 0)
    for consumed in heartbeats_fresh(kind=HeartbeatKind.WORKER).values_list("queues", flat=True):
        for queue in set(consumed or ()):
            if queue in counts:
                counts[queue] += 1
    return counts


def last_seen(*, kind: str) -> Heartbeat | None:
    return Heartbeat.objects.filter(kind=kind).order_by("-seen_at").first()
