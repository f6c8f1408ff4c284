"""A webhook fire on PostgreSQL writes its run, ``last_fired_at`` and ``run.created`` in one
round trip (config.one_round_trip): the same rows as the transaction path, all or nothing."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditEvent
from automations.models import Run
from config import one_round_trip
from tests.factories import fire
from triggers.models import Trigger

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="multi-statement queries: PostgreSQL"),
]

SAME = ("workspace_id", "automation_id", "automation_version", "snapshot_copy", "status", "trigger_type", "trigger_key",
        "trigger_id", "triggered_by", "principal_ids", "chain_depth", "concurrency_key", "queue",
        "phase", "step_index", "context", "cost_usd", "claimed_by", "parent_run_id")  # fmt: skip


def _run_and_event(run_id: str) -> tuple[dict, AuditEvent]:
    run = (
        Run.objects.filter(pk=run_id)
        .values(*SAME, "inputs", "trigger_payload", "enqueued_at", "created_at")
        .get()
    )
    event = AuditEvent.objects.get(type="run.created", refs__run=run_id)
    return run, event


def test_a_fire_outside_a_transaction_writes_the_rows_the_transaction_path_writes(hook, no_enqueue):
    automation, trigger, token = hook()
    client = APIClient()
    with transaction.atomic():  # the transaction path: BEGIN, INSERT, UPDATE, INSERT, (COMMIT)
        atomic_id = fire(client, automation.pk, {"n": 1}, token=token).json()["run_id"]
    before = Trigger.objects.get(pk=trigger.pk).last_fired_at

    with CaptureQueriesContext(connection) as queries:
        response = fire(client, automation.pk, {"n": 2}, token=token)

    assert response.status_code == 202, response.content
    fast_id = response.json()["run_id"]
    # the trigger lookup, then one query: INSERT run; UPDATE trigger; INSERT audit
    sql = [q["sql"] for q in queries.captured_queries]
    # (the lookup a SELECT, or on PostgreSQL the EXECUTE of the SELECT the first fire prepared)
    assert [s.split()[0] for s in sql] == ["EXECUTE", "PREPARE"] or [s.split()[0] for s in sql] == [
        "EXECUTE",
        "EXECUTE",
    ], sql
    # each of the three statements prepared once per database session, and executed
    executed = [s.split("(")[0].split()[1] for s in sql[1].split(";\n") if s.startswith("EXECUTE")]
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, statement FROM pg_prepared_statements")
        prepared = dict(cursor.fetchall())
    # (a statement's text is the whole query that prepared it: this name's PREPARE is in it)
    assert [
        prepared[name].split(f"PREPARE {name}", 1)[1].split(" AS ", 1)[1].split()[:3] for name in executed
    ] == [
        ["INSERT", "INTO", '"automations_run"'],
        ["UPDATE", '"triggers_trigger"', "SET"],
        ["INSERT", "INTO", "audit_auditevent"],
    ], sql
    atomic_run, atomic_event = _run_and_event(atomic_id)
    fast_run, fast_event = _run_and_event(fast_id)
    assert {k: fast_run[k] for k in SAME} == {k: atomic_run[k] for k in SAME}
    assert fast_run["snapshot_copy"] is None  # both refer to the automation's version
    assert fast_run["inputs"] == fast_run["trigger_payload"] == {"n": 2}
    assert fast_run["enqueued_at"] is not None
    assert (fast_event.summary, fast_event.actor, fast_event.workspace_id, fast_event.trace_id) == (
        atomic_event.summary, atomic_event.actor, atomic_event.workspace_id,
        Run.objects.get(pk=fast_id).trace_id,
    )  # fmt: skip
    assert fast_event.payload == {**atomic_event.payload, "inputs": {"n": 2}}
    assert Trigger.objects.get(pk=trigger.pk).last_fired_at > before
    assert [args[0] for args, _ in no_enqueue] == [atomic_id, fast_id]  # queued once written


def test_when_one_of_the_writes_fails_none_is_made_and_nothing_is_queued(hook, no_enqueue):
    automation, trigger, token = hook()
    client = APIClient()
    fired_before = Trigger.objects.get(pk=trigger.pk).last_fired_at
    runs_before, events_before = Run.objects.count(), AuditEvent.objects.count()
    with connection.cursor() as cursor:  # the ledger refuses the run.created row (the last statement)
        cursor.execute(
            "CREATE FUNCTION test_refuse_append() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$; "
            "CREATE TRIGGER test_refuse_append BEFORE INSERT ON audit_auditevent "
            "FOR EACH ROW EXECUTE FUNCTION test_refuse_append()"
        )
    try:
        response = fire(client, automation.pk, {"n": 1}, token=token)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "DROP TRIGGER test_refuse_append ON audit_auditevent; DROP FUNCTION test_refuse_append()"
            )

    assert response.status_code == 500
    assert response.json()["error"]["code"] == "INTERNAL"
    assert (Run.objects.count(), AuditEvent.objects.count()) == (runs_before, events_before)
    assert Trigger.objects.get(pk=trigger.pk).last_fired_at == fired_before
    assert no_enqueue == []


@pytest.mark.django_db(transaction=False)
def test_nothing_listens_for_the_signals_the_one_round_trip_path_does_not_send():
    for model in (Run, Trigger, AuditEvent):
        assert not pre_save.has_listeners(model), model
        assert not post_save.has_listeners(model), model


def test_the_insert_compiled_once_sends_what_the_compiler_writes_each_time(hook, no_enqueue, monkeypatch):
    automation, trigger, token = hook()
    run = Run.objects.get(pk=fire(APIClient(), automation.pk, {"n": 1}, token=token).json()["run_id"])
    run.pk, run._state.adding = uuid.uuid4(), True  # the same row again, unsaved
    monkeypatch.setattr(
        timezone, "now", lambda: datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    )  # auto_now_add
    monkeypatch.setattr(one_round_trip, "_insert_sql", {})

    compiled = one_round_trip.insert(run)  # the first: compiled by the ORM, its text kept
    assert [key[:2] for key in one_round_trip._insert_sql] == [(Run, "default")]
    cached = one_round_trip.insert(run)

    with connection.cursor() as cursor:
        assert cursor.mogrify(*cached) == cursor.mogrify(*compiled)
    one_round_trip.execute([cached])
    assert Run.objects.get(pk=run.pk).created_at == datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_the_row_update_compiled_once_sends_what_queryset_update_writes(hook, monkeypatch):
    automation, trigger, token = hook()
    when = datetime(2026, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
    monkeypatch.setattr(one_round_trip, "_update_row_sql", {})

    compiled = one_round_trip.update_row(Trigger, trigger.pk, {"last_fired_at": when})
    assert (Trigger, ("last_fired_at",), "default") in one_round_trip._update_row_sql
    cached = one_round_trip.update_row(Trigger, str(trigger.pk), {"last_fired_at": when})  # a str key too
    by_queryset = one_round_trip.update(Trigger.objects.filter(pk=trigger.pk), {"last_fired_at": when})

    with connection.cursor() as cursor:
        assert cursor.mogrify(*cached) == cursor.mogrify(*compiled) == cursor.mogrify(*by_queryset)
    one_round_trip.execute([cached])
    assert Trigger.objects.get(pk=trigger.pk).last_fired_at == when
