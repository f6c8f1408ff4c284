"""Statement budgets of the hot path (issue 11): one webhook fire, one one-step run.

Each SQL statement is a round trip to the database that every fire and every run
pays, so a change that adds one makes the platform slower for everyone. These
are upper bounds on the statements sent on the default connection, as Django's
query log records them (with BEGIN and COMMIT on PostgreSQL); the figures and the
profile behind them are in docs/performance.md. Committed transactions (no test
transaction around them), so the counts are the ones production sees.
"""

from __future__ import annotations

import sys
import uuid

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from automations import executor, services
from automations.enqueue import publish_run
from automations.models import Run, RunStatus, StepRun
from config.celery import app, queue_backlog
from tests.factories import definition, fire, webhook
from triggers.models import Trigger
from triggers.services import trigger_token_rotate

# Trigger lookup (with its automation), then the run insert, last_fired_at and one
# audit insert: on PostgreSQL one multi-statement query (config.one_round_trip), else
# one transaction (BEGIN … COMMIT); on the database rate-limit lane the window's
# upsert (and, first in a window, the clean-up of old windows) on top.
RATE_LIMIT_STATEMENTS = 0 if settings.AUTOPLANE_RATE_LIMIT_REDIS_URL else 2
FIRE_BUDGET = (2 if connection.vendor == "postgresql" else 6) + RATE_LIMIT_STATEMENTS
# One transaction: the claim (an UPDATE returning the run), the step rows' insert (one
# multi-row INSERT for a stretch of quick steps, however long), the run's finish, the
# event bus' subscriber check and event row, one audit insert for all the run's events
# (run.started, step.started/succeeded, run.succeeded, event.published). On PostgreSQL
# everything after the claim is one multi-statement query (the subscriber check inside
# the event's INSERT) ending in the COMMIT: BEGIN, claim, final writes, and the COMMIT
# Django logs (psycopg sends none: the transaction is already committed).
RUN_BUDGET = 4 if connection.vendor == "postgresql" else 8

pytestmark = pytest.mark.django_db(transaction=True)


def _statements(work) -> tuple[list[str], object]:
    with CaptureQueriesContext(connection) as queries:
        result = work()
    return [q["sql"] for q in queries.captured_queries], result


@pytest.fixture
def budget_hook(make_automation, owner):
    """A one-step automation (a templated ``transform_data``) with a webhook trigger and its token."""
    automation = make_automation(
        definition(
            name="budget",
            triggers=[webhook(rate_limit_per_minute=1000)],
            plan=[
                {
                    "step_id": "greet",
                    "action": "transform_data",
                    "config": {"output": {"greeting": "Hello {{ inputs.name }}"}},
                }
            ],
        )  # fmt: skip
    )
    trigger = Trigger.objects.get(automation=automation, key="hook")
    return automation, trigger_token_rotate(trigger=trigger, user=owner)


def test_one_webhook_fire_stays_within_its_statement_budget(budget_hook, no_enqueue):
    automation, token = budget_hook
    client = APIClient()
    assert fire(client, automation.pk, {"name": "warm"}, token=token).status_code == 202  # caches, connection

    sql, response = _statements(lambda: fire(client, automation.pk, {"name": "Ada"}, token=token))

    assert response.status_code == 202, response.content
    assert len(sql) <= FIRE_BUDGET, "\n".join(sql)
    assert Run.objects.filter(pk=response.json()["run_id"], status=RunStatus.QUEUED).exists()


def test_one_step_run_execution_stays_within_its_statement_budget(budget_hook, no_enqueue):
    automation, token = budget_hook
    client = APIClient()
    warm = fire(client, automation.pk, {"name": "warm"}, token=token).json()["run_id"]
    assert executor.execute_run(warm) == RunStatus.SUCCEEDED
    run_id = fire(client, automation.pk, {"name": "Ada"}, token=token).json()["run_id"]

    sql, status = _statements(lambda: executor.execute_run(run_id))

    assert status == RunStatus.SUCCEEDED
    assert len(sql) <= RUN_BUDGET, "\n".join(sql)
    run = Run.objects.get(pk=run_id)
    assert run.output == {"greeting": "Hello Ada"}
    assert StepRun.objects.get(run=run).status == "succeeded"


def test_a_ten_step_quick_run_costs_the_statements_of_a_one_step_run(make_automation, no_enqueue):
    """Quick steps share the claim's transaction, their audit INSERT and one multi-row step INSERT."""
    automation = make_automation(definition(
        name="ten quick steps",
        plan=[{"step_id": f"s{i}", "action": "transform_data", "output_as": f"s{i}",
               "config": {"output": {"i": i, "prev": f"{{{{ s{i - 1}.i }}}}" if i else None}}} for i in range(10)],
    ))  # fmt: skip
    warm = services.run_create(automation=automation, inputs={}).run
    assert executor.execute_run(str(warm.pk)) == RunStatus.SUCCEEDED
    run = services.run_create(automation=automation, inputs={}).run

    sql, status = _statements(lambda: executor.execute_run(str(run.pk)))

    assert status == RunStatus.SUCCEEDED
    assert len(sql) <= RUN_BUDGET, "\n".join(sql)
    steps = StepRun.objects.filter(run=run).order_by("index")
    assert [(s.step_id, s.status) for s in steps] == [(f"s{i}", "succeeded") for i in range(10)]
    assert steps[9].output["data"] == {"i": 9, "prev": 8}


# Python function calls of one fire through Django's whole request stack (the test client's
# own share included), the execute message's publish apart (``no_enqueue``; its budget is
# below): load-independent, like the statements. docs/performance.md, "The web side of a
# fire". Counted as Python function calls (not C builtins).
FIRE_CALL_BUDGET = 1_900 if connection.vendor == "postgresql" else 2_400
# One execute message on a Redis broker (config.redis_publish: one LPUSH); kombu's
# send_task path was several times that.
PUBLISH_CALL_BUDGET = 200


def _python_calls(work) -> tuple[int, object]:
    calls = 0

    def count(frame, event, arg) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        result = work()
    finally:
        sys.setprofile(None)
    return calls, result


def test_one_webhook_fire_stays_within_its_python_call_budget(budget_hook, no_enqueue):
    automation, token = budget_hook
    client = APIClient()
    for n in range(3):  # caches, connection, compiled statements
        assert fire(client, automation.pk, {"name": f"warm {n}"}, token=token).status_code == 202

    calls, response = _python_calls(lambda: fire(client, automation.pk, {"name": "Ada"}, token=token))

    assert response.status_code == 202, response.content
    print(f"python calls per fire: {calls}")
    assert calls <= FIRE_CALL_BUDGET
    assert len(no_enqueue) == 4


@pytest.mark.skipif(not str(app.conf.broker_url).startswith("redis://"), reason="the Redis broker's publish")
def test_one_execute_message_stays_within_its_python_call_budget():
    queue = f"test-budget-{uuid.uuid4().hex[:8]}"
    try:
        publish_run(str(uuid.uuid4()), queue)  # the client's connection
        calls, _ = _python_calls(lambda: publish_run(str(uuid.uuid4()), queue))
        assert queue_backlog((queue,))[queue] == 2
    finally:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)
    print(f"python calls per publish: {calls}")
    assert calls <= PUBLISH_CALL_BUDGET
