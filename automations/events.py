"""The domain-event bus (SPEC §6.3): ``publish()`` and ``subscribe()``.

No other code touches the ``DomainEvent`` table, so the bus can move to Redis
Streams later. Publishing stores the event and, after commit, queues its
delivery; delivery calls every subscriber (registered at start-up, e.g. by the
triggers app's ``AppConfig.ready``) with the event.

Delivery is at least once (SPEC §6.3): the event row is the record. A delivery
that cannot be queued (broker down) is not an error for the publisher, whose
event is committed; ``delivered_at`` is set once every subscriber had the event,
and :func:`redeliver` (the relay, on beat every ``AUTOPLANE_RELAY_SECONDS``)
queues again every event still undelivered ``AUTOPLANE_RELAY_AFTER_SECONDS``
after its last send, up to ``MAX_DELIVERY_ATTEMPTS`` failed deliveries.
Subscribers must therefore be idempotent: trigger matching dedupes per
(event, trigger).

An ``idempotency_key`` (``POST /events``' ``Idempotency-Key``) makes a publish
repeatable: the same key with the same body is the same event
(``created=False``); with another body it is refused (422).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connections, router, transaction
from django.db.models import F
from django.db.models.expressions import RawSQL
from django.utils import timezone

from audit import writer
from config import one_round_trip
from config.celery import app
from config.errors import InvalidArgument, ServiceError

from .models import DomainEvent

logger = logging.getLogger(__name__)

EVENT_TTL = timedelta(days=7)
DELIVER_TASK = "autoplane.deliver_event"
MAX_DELIVERY_ATTEMPTS = 5
MAX_IDEMPOTENCY_KEY_CHARS = 255
RELAY_BATCH = 500


class EventRefused(ServiceError):
    """An idempotency key reused with another body."""


@dataclass(frozen=True)
class Published:
    event_id: str
    created: bool


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
    principal_ids: tuple[int, ...] = ()  # the people behind the event (four-eyes)

    def document(self) -> dict[str, Any]:
        """What event filters and templates see."""
        return {
            "id": self.id,
            "event_type": self.event_type,
            "source": self.source,
            "payload": self.payload,
        }


Subscriber = Callable[[Event], object]  # what it returns is ignored
# Whether a subscriber cares about (workspace_id, event_type) at all; lets
# publish() skip queueing a delivery nobody would act on.
Interest = Callable[[int, str], bool]
_subscribers: list[tuple[Subscriber, Interest | None, str | None]] = []


def subscribe(
    handler: Subscriber, interested: Interest | None = None, interested_sql: str | None = None
) -> None:
    """``interested_sql``: the same test as ``interested``, as an SQL boolean over two parameters
    (workspace id, event type), so that :func:`publish_statement` decides it in the event's INSERT."""
    if all(existing is not handler for existing, _, _ in _subscribers):
        _subscribers.append((handler, interested, interested_sql))


def _wanted(workspace_id: int, event_type: str) -> bool:
    return any(
        interested is None or interested(workspace_id, event_type) for _, interested, _ in _subscribers
    )


def _wanted_sql(workspace_id: int, event_type: str) -> tuple[str, list[Any]]:
    """:func:`_wanted` as an SQL boolean (asked in Python if a subscriber has no SQL for it)."""
    parts: list[str] = []
    for _, interested, sql in _subscribers:
        if interested is None:
            return "TRUE", []
        if sql is None:
            return ("TRUE" if _wanted(workspace_id, event_type) else "FALSE"), []
        parts.append(f"({sql})")
    return " OR ".join(parts) or "FALSE", [workspace_id, event_type] * len(parts)


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
    principal_ids: Iterable[int] = (),
) -> str:
    """Store an event and queue its delivery after commit; returns the event id."""
    return publish_event(
        workspace_id=workspace_id, event_type=event_type, payload=payload, source=source, trace_id=trace_id,
        chain_depth=chain_depth, parent_run_id=parent_run_id, actor=actor, principal_ids=principal_ids,
    ).event_id  # fmt: skip


def publish_event(
    *,
    workspace_id: int,
    event_type: str,
    payload: Mapping[str, Any],
    source: str,
    trace_id: str | None = None,
    chain_depth: int = 0,
    parent_run_id: str | None = None,
    actor: str = "system",
    idempotency_key: str | None = None,
    request_hash: str = "",
    principal_ids: Iterable[int] = (),
) -> Published:
    """:func:`publish`, repeatable under an ``idempotency_key`` (raises EventRefused on another body)."""
    if idempotency_key is not None and not 1 <= len(idempotency_key) <= MAX_IDEMPOTENCY_KEY_CHARS:
        raise InvalidArgument([{"path": "/headers/Idempotency-Key", "code": "INVALID_ARGUMENT",
                                "message": f"an idempotency key has 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters"}])  # fmt: skip
    now = timezone.now()
    wanted = _wanted(workspace_id, event_type)
    try:
        # A savepoint only when a duplicate key can be expected and recovered from.
        with transaction.atomic(savepoint=idempotency_key is not None):
            event = DomainEvent.objects.create(
                workspace_id=workspace_id,
                event_type=event_type,
                source=source,
                payload=dict(payload),
                trace_id=trace_id or uuid.uuid4().hex,
                chain_depth=chain_depth,
                parent_run_id=parent_run_id,
                principal_ids=sorted(set(principal_ids)),
                expires_at=now + EVENT_TTL,
                idempotency_key=idempotency_key,
                request_hash=request_hash,
                sent_at=now,
                delivered_at=None if wanted else now,  # nobody subscribes: nothing to deliver
            )
            writer.append(
                trace_id=event.trace_id, type="event.published", summary=f"event {event_type} published",
                workspace_id=workspace_id, actor=actor, refs={"event": str(event.id)},
                payload={"event_type": event_type, "source": source, "chain_depth": chain_depth},
            )  # fmt: skip
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = DomainEvent.objects.filter(
            workspace_id=workspace_id, idempotency_key=idempotency_key
        ).first()
        if existing is None:  # the other one rolled back meanwhile
            raise EventRefused(
                "CONFLICT", "an event with this idempotency key is being published; retry", 409
            )
        if existing.request_hash != request_hash:
            raise EventRefused("UNPROCESSABLE", "idempotency key reused with a different request body", 422)
        return Published(str(existing.id), created=False)
    event_id = str(event.id)
    if wanted:
        transaction.on_commit(lambda: send_delivery(event_id))
    return Published(event_id, created=True)


# publish_statement's INSERT per (database alias, its delivered_at SQL): the compiler's text
# (one_round_trip.insert of the DomainEvent), kept only when its columns are _INSERT_COLUMNS in
# this order, so that _insert_params (the values as the compiler prepares them) fits it; a
# publish then makes no model instance (~25 us less per event). tests/automations/
# test_publish_statement.py compares the two.
_INSERT_COLUMNS = ("id", "workspace_id", "event_type", "source", "payload", "trace_id", "chain_depth",
                   "parent_run_id", "principal_ids", "created_at", "expires_at", "idempotency_key",
                   "request_hash", "sent_at", "delivered_at", "delivery_attempts")  # fmt: skip
_INSERT_HEAD = "INSERT INTO {} ({}) VALUES (%s, ".format(  # noqa: S608 - compared with the compiler's text
    f'"{DomainEvent._meta.db_table}"', ", ".join(f'"{column}"' for column in _INSERT_COLUMNS)
)
_insert_sql: dict[tuple[str, str], str] = {}


def _insert_params(
    connection: Any, pk: uuid.UUID, workspace_id: int, event_type: str, source: str, payload: Mapping[str, Any],
    trace_id: str, chain_depth: int, parent_run_id: Any, principal_ids: Iterable[int], now: Any,
    delivered_params: list[Any],
) -> list[Any]:  # fmt: skip
    """The values ``one_round_trip.insert`` prepares for publish_statement's DomainEvent, in
    _INSERT_COLUMNS' order (``created_at``: its ``auto_now_add`` time, here the event's ``now``)."""
    json_value = connection.ops.adapt_json_value
    adapt = connection.ops.adapt_datetimefield_value
    parent = None if parent_run_id is None else _PARENT.get_db_prep_value(parent_run_id, connection)
    return [
        pk, int(workspace_id), event_type, source, json_value(dict(payload), None), trace_id, int(chain_depth),
        parent, json_value(sorted(set(principal_ids)), None), adapt(now), adapt(now + EVENT_TTL), None, "",
        adapt(now), *delivered_params, 0,
    ]  # fmt: skip


_PARENT = DomainEvent._meta.get_field("parent_run_id")


def publish_statement(
    *,
    workspace_id: int,
    event_type: str,
    payload: Mapping[str, Any],
    source: str,
    trace_id: str | None = None,
    chain_depth: int = 0,
    parent_run_id: str | None = None,
    actor: str = "system",
    principal_ids: Iterable[int] = (),
) -> tuple[one_round_trip.Statement, Callable[[one_round_trip.Result], None]]:
    """:func:`publish` as a statement, for a caller that sends it with its other writes in one
    round trip inside its transaction (:func:`config.one_round_trip.send`, PostgreSQL).

    The subscriber check is part of the INSERT (``delivered_at`` is set at once when
    nobody subscribes), not a query of its own. Returns the statement and what to do
    with its result once sent: queue the delivery after commit if someone subscribes.
    The audit entry is appended as :func:`publish` appends it.
    """
    now = timezone.now()
    wanted, wanted_params = _wanted_sql(workspace_id, event_type)
    # The subscribers' own SQL (events.subscribe); the values are parameters.
    delivered_sql = f"CASE WHEN {wanted} THEN NULL ELSE %s END"
    pk = uuid.uuid4()
    trace_id = trace_id or uuid.uuid4().hex
    connection = connections[router.db_for_write(DomainEvent)]
    sql = _insert_sql.get((connection.alias, delivered_sql))
    if sql is not None:
        params = _insert_params(connection, pk, workspace_id, event_type, source, payload, trace_id, chain_depth,
                                parent_run_id, principal_ids, now, [*wanted_params, now])  # fmt: skip
    else:
        event = DomainEvent(
            id=pk, workspace_id=workspace_id, event_type=event_type, source=source, payload=dict(payload),
            trace_id=trace_id, chain_depth=chain_depth, parent_run_id=parent_run_id,
            principal_ids=sorted(set(principal_ids)), expires_at=now + EVENT_TTL, sent_at=now,
            delivered_at=RawSQL(delivered_sql, [*wanted_params, now]),  # noqa: S611
        )  # fmt: skip
        sql, params = one_round_trip.insert(event, using=connection.alias)
        if sql == f"{_INSERT_HEAD}{'%s, ' * 13}({delivered_sql}), %s)":  # the text _insert_params fits
            _insert_sql[(connection.alias, delivered_sql)] = sql
    writer.append(
        trace_id=trace_id, type="event.published", summary=f"event {event_type} published",
        workspace_id=workspace_id, actor=actor, refs={"event": str(pk)},
        payload={"event_type": event_type, "source": source, "chain_depth": chain_depth},
    )  # fmt: skip
    event_id = str(pk)

    def sent(result: one_round_trip.Result) -> None:
        _, rows = result
        if rows and rows[0][0]:  # delivered_at IS NULL: someone subscribes
            transaction.on_commit(lambda: send_delivery(event_id))

    return (sql + " RETURNING delivered_at IS NULL", params), sent


def send_delivery(event_id: str) -> bool:
    """Queue one delivery; a broker that is down is logged, not raised: the relay sends it later."""
    try:
        app.send_task(DELIVER_TASK, args=[event_id], ignore_result=True)
    except Exception as exc:  # kombu/redis raise several types; the event row is the record
        logger.warning("delivery of event %s not queued (%r); the relay will send it", event_id, exc)
        return False
    return True


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
        principal_ids=tuple(row.principal_ids or ()),
    )


def deliver(event_id: str) -> int:
    """Hand one stored event to every subscriber; returns how many were called.

    The event counts as delivered only when no subscriber raised (a database blip in
    matching, say): otherwise the relay delivers it again, and matching dedupes.
    """
    row = DomainEvent.objects.filter(id=event_id, delivered_at__isnull=True).first()
    if row is None:
        return 0  # unknown, expired or already delivered (a redelivery)
    event = _as_event(row)
    failed = False
    for handler, _, _ in list(_subscribers):
        try:
            handler(event)
        except Exception:
            failed = True
            logger.exception(
                "event subscriber %s failed for %s", getattr(handler, "__name__", handler), event_id
            )
    DomainEvent.objects.filter(id=event_id).update(
        delivered_at=None if failed else timezone.now(), delivery_attempts=F("delivery_attempts") + 1
    )
    return len(_subscribers)


def redeliver(now=None) -> int:
    """The relay: queue again every event still undelivered a while after its last send."""
    now = now or timezone.now()
    stale = DomainEvent.objects.filter(
        delivered_at__isnull=True,
        sent_at__lt=now - timedelta(seconds=settings.AUTOPLANE_RELAY_AFTER_SECONDS),
        delivery_attempts__lt=MAX_DELIVERY_ATTEMPTS,
        expires_at__gt=now,
    )
    sent = 0
    for event_id in list(stale.order_by("sent_at").values_list("id", flat=True)[:RELAY_BATCH]):
        # Stamped first, so the next relay tick does not send it yet again.
        DomainEvent.objects.filter(id=event_id).update(sent_at=now)
        if not send_delivery(str(event_id)):
            break  # the broker is still down: the next tick tries again
        sent += 1
    return sent


def purge_expired() -> int:
    deleted, _ = DomainEvent.objects.filter(expires_at__lt=timezone.now()).delete()
    return deleted
