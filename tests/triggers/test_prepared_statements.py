"""The hot path's statements prepared once per database session (config.one_round_trip, PostgreSQL).

A session that lost them (``DISCARD ALL``, ``DEALLOCATE``, a pooler handing over another
server session) or already has them must not fail a run or a fire: the run is claimed and
finished once, the fire writes its run once, and the audit chain verifies. A statement
PostgreSQL cannot prepare as declared goes as text. The real executor and fire service on a
real database."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

from audit.models import AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_chain
from automations import executor, services
from automations.models import Run, RunStatus, StepRun
from config import one_round_trip
from tests.factories import definition, fire, transform

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: the PostgreSQL lane"),
]

RUN_AUDIT = [
    "event.published",
    "run.created",
    "run.started",
    "run.succeeded",
    "step.started",
    "step.succeeded",
]


@pytest.fixture(autouse=True)
def _no_publish(monkeypatch):
    """The test drives every run itself (no broker, no shared worker running them concurrently)."""
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


def one_step_run(workspace) -> Run:
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("greet", {"hi": 1}))
    )
    return services.run_create(automation=automation, inputs={}).run


def ours() -> dict[str, str]:
    """This session's prepared statements of config.one_round_trip, by name."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT name, statement FROM pg_prepared_statements")
        return {
            name: text for name, text in cursor.fetchall() if name.startswith(one_round_trip.PREPARED_PREFIX)
        }


def ran_once(run: Run) -> None:
    run.refresh_from_db()
    assert (run.status, run.claimed_by, run.recoveries) == (RunStatus.SUCCEEDED, "", 0)
    assert StepRun.objects.filter(run=run).count() == 1
    assert (
        sorted(AuditEvent.objects.filter(trace_id=run.trace_id).values_list("type", flat=True)) == RUN_AUDIT
    )
    sequence_pending()
    assert verify_chain(f"ws-{run.workspace_id}").ok


def test_a_run_whose_session_lost_the_statements_runs_once(workspace):
    assert executor.execute_run(str(one_step_run(workspace).pk)) == RunStatus.SUCCEEDED
    assert len(ours()) >= 5  # the claim; the run's end, step row, event and audit entries
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # what a pooler's reset (DISCARD ALL) does behind our back

    run = one_step_run(workspace)
    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED

    ran_once(run)
    assert len(ours()) >= 5  # prepared again


def test_a_run_whose_session_already_has_the_statements_runs_once(workspace):
    """A pooler may hand this connection a server session in which another client prepared them."""
    assert executor.execute_run(str(one_step_run(workspace).pk)) == RunStatus.SUCCEEDED
    shapes = {shape.name: shape.prepare for shape in one_round_trip._shapes.values() if shape is not None}
    names = set(ours())
    connection.close()  # a new session, which this process thinks has none ...
    with connection.cursor() as cursor:  # ... but has them all
        for name in names:
            cursor.execute(shapes[name])
    assert set(ours()) == names

    run = one_step_run(workspace)
    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED

    ran_once(run)


def test_a_run_that_fails_after_its_prepares_leaves_the_session_known(workspace):
    """A PREPARE outlives the failed transaction it was sent in: the next run does not prepare it again."""
    connection.close()
    run = one_step_run(workspace)
    with connection.cursor() as cursor:  # the audit INSERT, the query's last statement, fails
        cursor.execute("CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ "
                       "BEGIN RAISE EXCEPTION 'refused by the test'; END $$; "
                       "CREATE TRIGGER test_refuse BEFORE INSERT ON audit_auditevent "
                       "FOR EACH ROW EXECUTE FUNCTION test_refuse();")  # fmt: skip
    try:
        with pytest.raises(Exception, match="refused by the test"):
            executor.execute_run(str(run.pk))
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER test_refuse ON audit_auditevent; DROP FUNCTION test_refuse();")

    assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
    ran_once(run)


def test_a_run_claimed_after_a_migration_added_a_column_to_runs_runs_once(workspace):
    """The claim returns the run's row (``RETURNING *``): a column added while a worker holds the
    statement prepared changes its result, which PostgreSQL refuses to run from the old plan."""
    assert executor.execute_run(str(one_step_run(workspace).pk)) == RunStatus.SUCCEEDED
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE automations_run ADD COLUMN test_added integer")
    try:
        run = one_step_run(workspace)
        assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
        ran_once(run)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE automations_run DROP COLUMN test_added")


@pytest.mark.parametrize("session", ["lost", "already-has"])
def test_a_fire_whose_session_is_out_of_step_writes_its_run_once(hook, no_enqueue, session):
    automation, _, token = hook(rate_limit_per_minute=1000)
    client = APIClient()
    assert fire(client, automation.pk, {"n": 1}, token=token).status_code == 202
    if session == "lost":
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE ALL")
    else:
        shapes = {shape.name: shape.prepare for shape in one_round_trip._shapes.values() if shape is not None}
        names = set(ours())
        connection.close()
        with connection.cursor() as cursor:
            for name in names:
                cursor.execute(shapes[name])

    response = fire(client, automation.pk, {"n": 2}, token=token)

    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["run_id"])
    assert run.inputs == {"n": 2}
    assert Run.objects.filter(automation=automation).count() == 2
    assert AuditEvent.objects.filter(trace_id=run.trace_id, type="run.created").count() == 1
    sequence_pending()
    assert verify_chain(f"ws-{automation.workspace_id}").ok


def test_a_statement_postgresql_cannot_prepare_as_declared_goes_as_text(workspace):
    """``unknown`` leaves a parameter's type to where it is used; where that says nothing, the
    PREPARE fails: the writes are sent again as text, and that statement stays text."""
    statement = (
        "UPDATE workspaces_workspace SET name = name WHERE id = %s AND %s IS NULL",
        [workspace.pk, None],
    )
    shape = one_round_trip._shape(*statement)
    assert shape is not None

    one_round_trip.execute([statement])
    one_round_trip.execute([statement])

    assert shape.name in one_round_trip._refused
    assert shape.name not in ours()


def test_with_prepared_statements_off_no_prepare_or_execute_is_ever_sent(hook, no_enqueue, settings):
    """``AUTOPLANE_PREPARED_STATEMENTS=off`` (a transaction pooler): the fire's trigger lookup and
    writes, the worker's claim and final query all go as their plain text; the session holds none."""
    settings.AUTOPLANE_PREPARED_STATEMENTS = False
    connection.close()  # a fresh session, which holds nothing
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    automation, _, token = hook(rate_limit_per_minute=1000)
    client = APIClient()
    with connection.execute_wrapper(record):
        responses = [fire(client, automation.pk, {"n": n}, token=token) for n in range(3)]
        for response in responses:
            assert response.status_code == 202, response.content
            assert executor.execute_run(response.json()["run_id"]) == RunStatus.SUCCEEDED

    assert sent
    words = {word for sql in sent for word in sql.upper().replace(";", " ").split()}
    assert not words & {"PREPARE", "EXECUTE", "DEALLOCATE"}, [s for s in sent if "PREPARE" in s.upper()]
    assert any("UPDATE automations_run" in sql and "RETURNING" in sql for sql in sent)  # the claim, as text
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone() == (0,)
    for response in responses:
        ran_once(Run.objects.get(pk=response.json()["run_id"]))
