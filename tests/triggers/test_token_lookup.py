"""The fire's trigger lookup (``webhooks.trigger_by_token_hash``): the ORM's SELECT compiled once
per connection, returning what the queryset returns (issue 11's lean fire path)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from config import one_round_trip
from triggers import services, webhooks
from triggers.models import Trigger

pytestmark = pytest.mark.django_db(transaction=True)


def _fields(obj) -> dict:
    return {f.attname: getattr(obj, f.attname) for f in obj._meta.concrete_fields}


def test_the_lookup_returns_the_trigger_and_automation_the_orm_returns(hook):
    automation, trigger, token = hook(rate_limit_per_minute=7, require_signature=True)
    digest = services.token_hash(token)
    expected = Trigger.objects.select_related("automation").get(token_hash=digest)

    with CaptureQueriesContext(connection) as queries:
        found = webhooks.trigger_by_token_hash(digest)
        assert found is not None
        assert found.automation.pk == automation.pk  # loaded with it: no second query
        assert found.config["rate_limit_per_minute"] == 7  # JSON converted as the ORM does

    assert len(queries.captured_queries) == 1
    assert "ORDER BY" not in queries.captured_queries[0]["sql"]  # the hash is unique
    assert _fields(found) == _fields(expected)
    assert _fields(found.automation) == _fields(expected.automation)
    assert found.automation.definition == automation.definition
    assert not found._state.adding
    assert found._state.db == expected._state.db
    assert found.get_deferred_fields() == found.automation.get_deferred_fields() == set()


def test_an_unknown_hash_finds_nothing_and_a_revoked_token_is_read_as_revoked(hook, owner):
    automation, trigger, token = hook()
    assert webhooks.trigger_by_token_hash(services.token_hash(token + "x")) is None
    services.trigger_token_revoke(trigger=trigger, user=owner)
    found = webhooks.trigger_by_token_hash(services.token_hash(token))
    assert found is not None
    assert found.token_revoked_at is not None


def test_each_thread_compiles_its_own_lookup_on_its_own_connection(hook):
    automation, trigger, token = hook()
    digest = services.token_hash(token)
    assert webhooks.trigger_by_token_hash(digest).pk == trigger.pk
    seen: list = []

    def other_thread() -> None:
        try:
            seen.append(webhooks.trigger_by_token_hash(digest).pk)
            seen.append(connections["default"])
        finally:
            connections.close_all()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    mine = connections["default"]
    assert seen[0] == trigger.pk
    assert seen[1] is not mine
    assert mine in webhooks._token_lookups
    assert webhooks._token_lookups.get(seen[1]) is not webhooks._token_lookups[mine]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: the PostgreSQL lane")
def test_on_postgresql_the_lookup_is_prepared_once_per_session_and_read_on_every_fire(hook, owner):
    automation, trigger, token = hook()
    digest = services.token_hash(token)
    connection.close()  # a session that has not prepared it yet
    connection.ensure_connection()
    name = one_round_trip._shape(webhooks._token_lookup(connections["default"]).sql, [digest]).name

    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert webhooks.trigger_by_token_hash(digest).pk == trigger.pk
    sent = [q["sql"] for q in queries.captured_queries]
    assert sent[0].startswith(f"PREPARE {name}(unknown) AS SELECT ")  # and EXECUTE, one trip
    assert "ORDER BY" not in sent[0]  # the hash is unique
    assert sent[1:] == [f"EXECUTE {name}('{digest}')"] * 2
    with connection.cursor() as cursor:  # the plan reads the hash's index
        cursor.execute(f"EXPLAIN EXECUTE {name}(%s)", [digest])
        plan = " ".join(row[0] for row in cursor.fetchall())
    assert "Index Scan" in plan or "Index Only Scan" in plan, plan

    # a revocation, then a rotation, is seen at once: the statement is kept, not its answer
    services.trigger_token_revoke(trigger=trigger, user=owner)
    assert webhooks.trigger_by_token_hash(digest).token_revoked_at is not None
    services.trigger_token_rotate(trigger=Trigger.objects.get(pk=trigger.pk), user=owner)
    assert webhooks.trigger_by_token_hash(digest) is None

    # a session that lost it (DISCARD ALL by a pooler, say) prepares it again
    with connection.cursor() as cursor:
        cursor.execute(f"DEALLOCATE {name}")
    assert webhooks.trigger_by_token_hash(digest) is None
    assert webhooks.trigger_by_token_hash(digest) is None


@pytest.mark.skipif(connection.vendor != "postgresql", reason="prepared statements: the PostgreSQL lane")
def test_a_session_that_already_has_the_lookup_prepared_executes_it(hook):
    automation, trigger, token = hook()
    digest = services.token_hash(token)
    assert webhooks.trigger_by_token_hash(digest).pk == trigger.pk
    one_round_trip._sessions[connection.connection] = (
        set()
    )  # as if a pooler handed over a session that has it

    assert webhooks.trigger_by_token_hash(digest).pk == trigger.pk
    assert webhooks.trigger_by_token_hash(digest).pk == trigger.pk
