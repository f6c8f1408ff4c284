"""The worker's INSERTs written from a cached text (config.one_round_trip): the step rows'
multi-row INSERT per number of rows, and the event's INSERT whose ``delivered_at`` is SQL
(RawSQL). Each must send exactly what the ORM's compiler writes, every time."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models.expressions import RawSQL
from django.utils import timezone

from automations import services
from automations.models import DomainEvent, StepRun
from config import one_round_trip
from tests.factories import definition, transform

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="multi-statement queries: PostgreSQL"),
]

WHEN = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


@pytest.fixture
def frozen_now(monkeypatch):
    monkeypatch.setattr(timezone, "now", lambda: WHEN)  # auto_now_add fields


def _steps(run, n: int, tag: str) -> list[StepRun]:
    return [
        StepRun(run=run, phase="plan", index=i, step_id=f"{tag}{i}", action="transform_data", status="succeeded",
                output={"i": i, "tag": tag}, started_at=WHEN, finished_at=WHEN)
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("n", [1, 3])
def test_the_step_rows_insert_from_the_cache_is_the_compilers(workspace, frozen_now, monkeypatch, n):
    automation = services.automation_create(workspace=workspace, definition=definition(transform("a", {})))
    run = services.run_create(automation=automation, inputs={}).run
    monkeypatch.setattr(one_round_trip, "_insert_many_sql", {})

    compiled = one_round_trip.insert_many(_steps(run, n, "x"))  # compiled by the ORM, its text kept
    # One row (a one-step run's): its VALUES text kept. Several: Django writes an UNNEST of one
    # array per column on PostgreSQL, compiled each time.
    assert list(one_round_trip._insert_many_sql) == ([(StepRun, "default", 1)] if n == 1 else [])
    cached = one_round_trip.insert_many(_steps(run, n, "x"))
    assert cached[0] == compiled[0]
    with connection.cursor() as cursor:
        assert cursor.mogrify(*cached) == cursor.mogrify(*compiled)

    with transaction.atomic():
        [(count, ids)] = one_round_trip.send([one_round_trip.insert_many(_steps(run, n, "y"))])
    assert count == n
    assert ids is not None
    rows = list(StepRun.objects.filter(run=run).order_by("index"))
    assert [(r.pk, r.step_id, r.output, r.finished_at) for r in rows] == [
        (pk, f"y{i}", {"i": i, "tag": "y"}, WHEN) for i, (pk,) in enumerate(ids)
    ]


def _event(workspace_id: int, flag: bool) -> DomainEvent:
    return DomainEvent(
        id=uuid.uuid4(), workspace_id=workspace_id, event_type="t.happened", source="test", payload={"a": 1},
        trace_id="trace", expires_at=WHEN, sent_at=WHEN,
        delivered_at=RawSQL("CASE WHEN %s THEN NULL ELSE %s END", [flag, WHEN]),  # noqa: S611
    )  # fmt: skip


def test_an_insert_with_a_value_in_sql_from_the_cache_is_the_compilers(workspace, frozen_now, monkeypatch):
    monkeypatch.setattr(one_round_trip, "_insert_sql", {})
    event = _event(workspace.pk, True)

    compiled = one_round_trip.insert(event)
    assert len(one_round_trip._insert_sql) == 1
    cached = one_round_trip.insert(event)
    assert cached[0] == compiled[0]
    with connection.cursor() as cursor:
        assert cursor.mogrify(*cached) == cursor.mogrify(*compiled)

    delivered, undelivered = _event(workspace.pk, False), _event(workspace.pk, True)
    one_round_trip.execute([one_round_trip.insert(delivered), one_round_trip.insert(undelivered)])
    assert DomainEvent.objects.get(pk=delivered.pk).delivered_at == WHEN
    assert DomainEvent.objects.get(pk=undelivered.pk).delivered_at is None
    assert DomainEvent.objects.get(pk=undelivered.pk).created_at == WHEN
    # Other SQL for the value: its own text, compiled afresh.
    other = _event(workspace.pk, True)
    other.delivered_at = RawSQL("%s", [WHEN])  # noqa: S611
    assert one_round_trip.insert(other)[0] != compiled[0]
    assert len(one_round_trip._insert_sql) == 2
