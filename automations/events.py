"""The domain-event bus (SPEC §6.3): ``publish()`` and ``subscribe()``.

No other code touches the ``DomainEvent`` table, so the bus can move to Redis
Streams later. Publishing stores the event and, after commit, queues its
delivery; delivery calls every subscriber (registered at start-up, e.g. by the
triggers app's ``AppConfig.ready``) with the event.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from audit import writer

from .models import DomainEvent

logger = logging.getLogger(__name__)

EVENT_TTL = timedelta(days=7)
DELIVER_TASK = "autoplane.deliver_event"


@dataclass(frozen=True)
class Event:
    id: str
    workspace_id: int
    event_type: str
    source: str
    payload: Mapping[str, Any]
    trace_id: str
    chain_depth: int
    parent_run_id: str | None

    def document(self) -> dict[str, Any]:
        """What event filters and templates see."""
        return {
            "id": self.id,
            "event_type": self.event_type,
            "source": self.source,
            "payload": self.payload,
        }


Subscriber = Callable[[Event], None]
# Whether a subscriber cares about (workspace_id, event_type) at all; lets
# publish() skip queueing a delivery nobody would act on.
Interest = Callable[[int, str], bool]
_subscribers: list[tuple[Subscriber, Interest | None]] = []


def subscribe(handler: Subscriber, interested: Interest | None = None) -> None:
    if all(existing is not handler for existing, _ in _subscribers):
        _subscribers.append((handler, interested))


def _wanted(workspace_id: int, event_type: str) -> bool:
    return any(interested is None or interested(workspace_id, event_type) for _, interested in _subscribers)


def publish(
    *,
    workspace_id: int,
    event_type: str,
    payload: Mapping[str, Any],
    source: str,
    trace_id: str | None = None,
    chain_depth: int = 0,
    parent_run_id: str | None = None,
    actor: str = "system",
) -> str:
    """Store an event and queue its delivery after commit; returns the event id."""
    from config.celery import app

    with transaction.atomic(savepoint=False):
        event = DomainEvent.objects.create(
            workspace_id=workspace_id,
            event_type=event_type,
            source=source,
            payload=dict(payload),
            trace_id=trace_id or uuid.uuid4().hex,
            chain_depth=chain_depth,
            parent_run_id=parent_run_id,
            expires_at=timezone.now() + EVENT_TTL,
        )
        writer.append(
            trace_id=event.trace_id, type="event.published", summary=f"event {event_type} published",
            workspace_id=workspace_id, actor=actor, refs={"event": str(event.id)},
            payload={"event_type": event_type, "source": source, "chain_depth": chain_depth},
        )  # fmt: skip
        event_id = str(event.id)
        if _wanted(workspace_id, event_type):
            transaction.on_commit(lambda: app.send_task(DELIVER_TASK, args=[event_id]))
    return event_id


def _as_event(row: DomainEvent) -> Event:
    return Event(
        id=str(row.id),
        workspace_id=row.workspace_id,
        event_type=row.event_type,
        source=row.source,
        payload=row.payload,
        trace_id=row.trace_id,
        chain_depth=row.chain_depth,
        parent_run_id=str(row.parent_run_id) if row.parent_run_id else None,
    )


def deliver(event_id: str) -> int:
    """Hand one stored event to every subscriber; returns how many were called."""
    row = DomainEvent.objects.filter(id=event_id).first()
    if row is None:
        return 0
    event = _as_event(row)
    for handler, _ in list(_subscribers):
        try:
            handler(event)
        except Exception:
            logger.exception(
                "event subscriber %s failed for %s", getattr(handler, "__name__", handler), event_id
            )
    return len(_subscribers)


def purge_expired() -> int:
    deleted, _ = DomainEvent.objects.filter(expires_at__lt=timezone.now()).delete()
    return deleted
