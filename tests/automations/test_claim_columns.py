"""The claim's row read by column name (config.one_round_trip.first_in_transaction): on psycopg the
names come from the result itself, not cursor.description; they must be the same names, in order,
or the claimed run would carry another column's value."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from automations import claim, services
from automations.models import Run
from config import one_round_trip
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db(transaction=True)


def test_column_names_are_the_cursors_own():
    sql = "SELECT 1 AS one, 'x' AS \"Two words\", NULL AS three_é"
    with transaction.atomic():
        names, rows = one_round_trip.first_in_transaction(sql, [])
    with connection.cursor() as cursor:
        cursor.execute(sql)
        assert names == [column[0] for column in cursor.description]
    assert names == ["one", "Two words", "three_é"]
    assert len(rows) == 1


def test_a_claimed_run_is_the_row_the_orm_reads(workspace, monkeypatch):
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("t", {"a": 1}))
    )
    run = services.run_create(automation=automation, inputs={"name": "x"}).run
    with transaction.atomic():
        claimed = claim.claim(str(run.pk), "host:1")
    assert claimed is not None
    stored = Run.objects.get(pk=run.pk)
    for field in Run._meta.concrete_fields:
        assert getattr(claimed, field.attname) == getattr(stored, field.attname), field.name
    assert claimed.workspace.egress_allowlist == workspace.egress_allowlist
