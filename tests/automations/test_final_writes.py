"""The run's final writes in one round trip (issue 11, PostgreSQL): the run's end, its new
step rows, its event, its audit entries and the COMMIT are one multi-statement query
ending the claim's transaction. All of it commits with the claim or none of it does: a
statement that fails, or a fence that misses (checked in SQL, before the COMMIT), leaves
the run as if never claimed, and the next claim runs it once. The real executor on a real database; a database trigger makes
one statement of the query fail."""

from __future__ import annotations

import re
import tempfile

import pytest
from django.db import DatabaseError, connection, transaction
from psycopg.pq import Trace

from audit import writer
from audit.models import AuditEvent
from automations import events, executor, services
from automations.claim import claim
from automations.models import DomainEvent, Run, RunStatus, StepRun
from tests.factories import definition, event, http_step, transform

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="one round trip: the PostgreSQL lane"),
]


@pytest.fixture(autouse=True)
def _no_publish(monkeypatch):
    """The test drives every run itself: no execute_run message reaches a broker, where the
    session's shared worker (left running by an earlier live test) would run it concurrently."""
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


FAIL_RUN_SUCCEEDED_AUDIT = """
CREATE FUNCTION test_refuse_run_succeeded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.type = 'run.succeeded' THEN RAISE EXCEPTION 'refused by the test'; END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_refuse_run_succeeded BEFORE INSERT ON audit_auditevent
    FOR EACH ROW EXECUTE FUNCTION test_refuse_run_succeeded();
"""
ALLOW = (
    "DROP TRIGGER test_refuse_run_succeeded ON audit_auditevent; DROP FUNCTION test_refuse_run_succeeded();"
)


def one_step_run(workspace) -> Run:
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("greet", {"hi": 1}))
    )
    return services.run_create(automation=automation, inputs={}).run


def traces(run: Run) -> dict[str, object]:
    """What a claim and an execution leave behind, besides the run row."""
    return {
        "steps": StepRun.objects.filter(run=run).count(),
        "events": DomainEvent.objects.filter(parent_run_id=run.pk).count(),
        "audit": sorted(
            AuditEvent.objects.filter(trace_id=run.trace_id)
            .exclude(type="run.created")
            .values_list("type", flat=True)
        ),  # fmt: skip
    }


def test_a_one_step_run_sends_its_final_writes_in_one_query(workspace):
    """Each statement of the query is one PREPAREd once per database session: the session's
    first such run prepares them in its query, every later run only EXECUTEs them."""
    first, run = one_step_run(workspace), one_step_run(workspace)
    sent = []

    def count(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    assert executor.execute_run(str(first.pk)) == RunStatus.SUCCEEDED
    with connection.execute_wrapper(count):
        assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED

    assert len(sent) == 2, sent  # the claim; then the run's end, step row, event, audit entries, COMMIT
    statements = sent[1].split(";\n")
    assert len(statements) == 5, sent[1]
    assert all(statement.startswith("EXECUTE autoplane_q_") for statement in statements[:4]), sent[1]
    assert statements[4] == "COMMIT", sent[1]
    assert sent[0].startswith("BEGIN;\nEXECUTE autoplane_q_"), sent[0]  # the claim, prepared too
    assert not connection.in_atomic_block
    assert traces(run) == {"steps": 1, "events": 1,
                           "audit": ["event.published", "run.started", "run.succeeded", "step.started",
                                     "step.succeeded"]}  # fmt: skip
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.lease_expires_at) == (RunStatus.SUCCEEDED, "", None)
    step = StepRun.objects.get(run=run)
    assert step.status == "succeeded"
    assert step.finished_at is not None


def _queries_on_the_wire(work) -> tuple[list[str], object]:
    """The queries the client really sent to PostgreSQL while ``work()`` ran (libpq's trace of
    the frontend's Query messages): psycopg's own BEGIN and COMMIT included, which no Django
    execute wrapper sees."""
    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        pgconn.set_trace_flags(Trace.SUPPRESS_TIMESTAMPS)
        try:
            result = work()
        finally:
            pgconn.untrace()
        trace.seek(0)
        messages = re.split(r"\n(?=[FB]\t)", trace.read())  # a query's text may hold newlines
    return [message for message in messages if message.startswith("F\t") and "\tQuery\t" in message], result


def test_a_one_step_run_is_two_round_trips_its_begin_sent_with_the_claim(workspace):
    run = one_step_run(workspace)
    sent, status = _queries_on_the_wire(lambda: executor.execute_run(str(run.pk)))

    assert status == RunStatus.SUCCEEDED
    assert len(sent) == 2, sent  # BEGIN + the claim; the final writes + COMMIT
    assert '"BEGIN;' in sent[0], sent[0]
    assert "UPDATE automations_run" in sent[0] or "EXECUTE autoplane_q_" in sent[0], sent[0]
    assert sent[1].rstrip().endswith('COMMIT"'), sent[1]
    assert not connection.in_atomic_block
    run.refresh_from_db()
    assert (run.status, run.claimed_by) == (RunStatus.SUCCEEDED, "")


def test_the_claimed_run_is_the_run_the_orm_reads(workspace):
    """The claim builds its Run from the row without a queryset: every field as the ORM reads it."""
    run = one_step_run(workspace)
    with transaction.atomic():
        claimed = claim(str(run.pk), "worker-a:1")
        assert claimed is not None
        read = Run.objects.get(pk=run.pk)
        for field in Run._meta.concrete_fields:
            assert getattr(claimed, field.attname) == getattr(read, field.attname), field.name
        assert claimed._state.adding is False
        assert claimed._state.db == "default"
        assert claimed.workspace.egress_allowlist == read.workspace.egress_allowlist
        assert claimed.workspace.default_autonomy == read.workspace.default_autonomy
        assert claimed.has_step_runs is False
        assert claimed.first_claim is True
        assert (claimed.status, claimed.claimed_by) == (RunStatus.RUNNING, "worker-a:1")


def test_a_claim_whose_begin_went_with_it_rolls_back_on_an_error(workspace):
    """The transaction the claim's query opened is psycopg's and Django's as usual: an error
    after the claim rolls it back (ROLLBACK sent), and the run is claimable again."""
    run = one_step_run(workspace)

    def claim_then_fail() -> None:
        with transaction.atomic():
            assert claim(str(run.pk), "worker-a:1") is not None
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        claim_then_fail()
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.started_at) == (RunStatus.QUEUED, "", None)
    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED


def test_a_failing_statement_rolls_back_the_whole_query_and_the_claim_then_the_run_runs_once(workspace):
    run = one_step_run(workspace)
    with connection.cursor() as cursor:
        cursor.execute(FAIL_RUN_SUCCEEDED_AUDIT)
    try:
        # The audit INSERT is the last statement of the query: the run's UPDATE, the
        # step row and the event row before it went through, and must not commit.
        with pytest.raises(DatabaseError, match="refused by the test"):
            executor.execute_run(str(run.pk))
        run.refresh_from_db()
        assert (run.status, run.claimed_by, run.started_at, run.recoveries) == (RunStatus.QUEUED, "", None, 0)
        assert traces(run) == {"steps": 0, "events": 0, "audit": []}
    finally:
        with connection.cursor() as cursor:
            cursor.execute(ALLOW)

    # The broker gives the message back (acks_late) or the sweep re-sends it: claimed afresh.
    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
    assert traces(run) == {"steps": 1, "events": 1,
                           "audit": ["event.published", "run.started", "run.succeeded", "step.started",
                                     "step.succeeded"]}  # fmt: skip


@pytest.mark.parametrize("then_slow", [False, True], ids=["run-ends", "a-slow-step-follows"])
def test_a_run_update_that_misses_its_fence_rolls_back_everything_sent_with_it(workspace, then_slow):
    """Under the claim's row lock the fence cannot miss; if it did, its row count says so and
    nothing of the query (nor the claim) commits. Here the executor is not the claimant.
    Either the run ends in the query, or a slow step follows the quick one (the query then
    carries the run's progress, the step row and the audit entries, sent before the commit)."""
    steps = [transform("greet", {"hi": 1})] + (
        [http_step("call", "http://127.0.0.1:9/")] if then_slow else []
    )
    automation = services.automation_create(workspace=workspace, definition=definition(*steps))
    run = services.run_create(automation=automation, inputs={}).run
    with transaction.atomic(), writer.batch():
        claimed = claim(str(run.pk), "worker-a:1")
        assert claimed is not None
        assert executor.Executor(claimed, "worker-b:2").begin() is False

    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.started_at, run.step_index) == (RunStatus.QUEUED, "", None, 0)
    assert traces(run) == {"steps": 0, "events": 0, "audit": []}
    if not then_slow:
        assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
        assert traces(run)["steps"] == 1


def test_the_subscriber_check_in_the_event_insert_answers_as_the_python_check(workspace, other_workspace,
                                                                              monkeypatch):  # fmt: skip
    """The event row's INSERT decides ``delivered_at`` with the subscribers' SQL: the same
    answer as their Python check in every case it tells apart, and a delivery is queued
    after commit only when someone subscribes."""
    from triggers.models import Trigger

    queued: list[str] = []
    monkeypatch.setattr(events, "send_delivery", queued.append)
    done = "automation.run.succeeded"
    watcher = services.automation_create(
        workspace=workspace, definition=definition(transform("t", 1), triggers=[event("on-done", done)])
    )
    watched = one_step_run(workspace)

    def answers(ws: int, event_type: str) -> tuple[bool, bool]:
        sql, params = events._wanted_sql(ws, event_type)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {sql}", params)  # noqa: S608
            return events._wanted(ws, event_type), cursor.fetchone()[0]

    assert answers(workspace.pk, done) == (True, True)
    assert answers(workspace.pk, "automation.run.failed") == (False, False)
    assert answers(other_workspace.pk, done) == (False, False)
    Trigger.objects.filter(automation=watcher).update(enabled=False)
    assert answers(workspace.pk, done) == (False, False)
    Trigger.objects.filter(automation=watcher).update(enabled=True)
    type(watcher).objects.filter(pk=watcher.pk).update(status="paused")
    assert answers(workspace.pk, done) == (False, False)
    type(watcher).objects.filter(pk=watcher.pk).update(status="active")
    assert answers(workspace.pk, done) == (True, True)

    assert executor.execute_run(str(watched.pk)) == RunStatus.SUCCEEDED
    subscribed = DomainEvent.objects.get(parent_run_id=watched.pk)
    assert subscribed.delivered_at is None
    assert queued == [str(subscribed.pk)]

    Trigger.objects.filter(automation=watcher).update(enabled=False)
    unwatched = one_step_run(workspace)
    assert executor.execute_run(str(unwatched.pk)) == RunStatus.SUCCEEDED
    assert DomainEvent.objects.get(parent_run_id=unwatched.pk).delivered_at is not None  # nothing to deliver
    assert queued == [str(subscribed.pk)]


def test_a_run_held_behind_a_concurrency_limit_is_sent_once_the_query_committed_the_run_ahead(workspace,
                                                                                              monkeypatch):  # fmt: skip
    """The run's end commits inside its query; what follows in the worker (``run_settled``: the
    next held run is let through) then writes in a transaction of its own, and commits too."""
    sent: list[str] = []
    monkeypatch.setattr(
        "automations.enqueue.publish_run", lambda run_id, *args, **kwargs: sent.append(str(run_id))
    )
    automation = services.automation_create(workspace=workspace, definition=definition(
        transform("greet", {"hi": 1}), execution={"concurrency": "allow_parallel", "max_concurrent": 1}))  # fmt: skip
    first, held = (services.run_create(automation=automation, inputs={}).run for _ in range(2))
    assert Run.objects.get(pk=held.pk).enqueued_at is None

    assert executor.execute_run(str(first.pk)) == RunStatus.SUCCEEDED

    assert not connection.in_atomic_block
    assert Run.objects.get(pk=held.pk).enqueued_at is not None
    assert sent[-1] == str(held.pk)
    assert executor.execute_run(str(held.pk)) == RunStatus.SUCCEEDED
    assert traces(held) == {"steps": 1, "events": 1,
                            "audit": ["event.published", "run.started", "run.succeeded", "step.started",
                                      "step.succeeded"]}  # fmt: skip
