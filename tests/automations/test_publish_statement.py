"""events.publish_statement builds its INSERT's values itself (no DomainEvent instance) once the
compiler's text is known: the query it sends must be the one the compiler's own statement
(one_round_trip.insert of the DomainEvent) gives, byte for byte, and the row it writes the event."""

from __future__ import annotations

import datetime
import uuid

import pytest
from django.db import connection, transaction

from automations import events
from automations.models import DomainEvent
from config import one_round_trip

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="publish_statement: the PostgreSQL lane"),
]

NOW = datetime.datetime(2026, 11, 24, 20, 30, 1, 123456, tzinfo=datetime.UTC)
PARENT = uuid.uuid4()
CASES = [
    {"parent_run_id": None, "principal_ids": ()},
    {"parent_run_id": str(PARENT), "principal_ids": [3, 1, 3], "chain_depth": 2, "trace_id": "t-1"},
    {"parent_run_id": PARENT, "principal_ids": {7}, "payload": {"ü": ["x", 1.5, None]}},
]


def _statement(monkeypatch, case, subscribed):
    monkeypatch.setattr(events.timezone, "now", lambda: NOW)
    monkeypatch.setattr(events.uuid, "uuid4", lambda: PARENT)
    if subscribed:
        monkeypatch.setattr(events, "_subscribers", [(print, None, None)])
    kwargs = {
        "workspace_id": 5,
        "event_type": "run.succeeded",
        "payload": {"run_id": "r"},
        "source": "run:r",
    } | case
    with transaction.atomic():
        (sql, params), _ = events.publish_statement(**kwargs)
    return sql, params


@pytest.mark.parametrize("subscribed", [False, True])
@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_the_direct_values_are_the_compiler_s(monkeypatch, case, subscribed):
    events._insert_sql.clear()
    compiled = _statement(monkeypatch, case, subscribed)  # the compiler's: the text is cached from it
    assert events._insert_sql
    direct = _statement(monkeypatch, case, subscribed)  # the values made directly
    # (timezone.now is frozen for both: auto_now_add's created_at too)
    with connection.cursor() as cursor:
        mogrify = cursor.cursor.mogrify
        assert mogrify(*direct) == mogrify(*compiled)


@pytest.mark.parametrize("subscribed", [False, True])
def test_a_published_event_s_row(workspace, subscribed, monkeypatch):
    if subscribed:
        monkeypatch.setattr(events, "_subscribers", [(print, None, None)])
    for _ in range(2):  # the compiler's statement, then the direct one
        with transaction.atomic():
            statement, sent = events.publish_statement(
                workspace_id=workspace.id, event_type="run.succeeded", payload={"a": 1}, source="run:x",
                parent_run_id=str(PARENT), principal_ids=[2, 2, 1],
            )  # fmt: skip
            [result] = one_round_trip.send([statement])
            sent(result)
    rows = list(DomainEvent.objects.filter(workspace_id=workspace.id).order_by("created_at"))
    assert len(rows) == 2
    for row in rows:
        assert (row.event_type, row.source, row.payload, row.parent_run_id, row.principal_ids) == (
            "run.succeeded", "run:x", {"a": 1}, PARENT, [1, 2])  # fmt: skip
        assert row.created_at >= row.sent_at  # auto_now_add's own clock for the compiler's
        assert row.expires_at == row.sent_at + events.EVENT_TTL
        assert (row.delivered_at is None) == subscribed
