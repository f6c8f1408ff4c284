"""A batch's entries go in one INSERT (on PostgreSQL as one JSON parameter holding every row): each
stored row is the entry as appended (texts, workspace, the timestamp to the microsecond, the sealed
hash), in append order, and the chain verifies."""

from __future__ import annotations

import datetime

import pytest
from django.db import transaction

from audit import writer
from audit.models import AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_chain

TEXTS = [
    "plain",
    "quote ' double \" backslash \\ and \\u0000 as text",
    "ünïcode \u2603 \U0001f600 tab\t newline\n cr\r",
    "nul \x00 inside",
    "lone surrogate \ud800",
    "%s %(name)s $1 ::json -> ->> '{}'",
]


@pytest.mark.django_db
@pytest.mark.unsequenced
@pytest.mark.parametrize("workspace_id", [None, 2**40])
def test_a_batch_s_rows_are_the_entries_as_appended(workspace_id, monkeypatch):
    # given entries with awkward texts, one of them at a whole second
    whole_second = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    with transaction.atomic(), writer.batch():
        events = []
        for i, text in enumerate(TEXTS):
            if i == 1:
                monkeypatch.setattr(writer.timezone, "now", lambda: whole_second)
            events.append(
                writer.append(trace_id=f"t{text}", type="test.rows", summary=text, stage=text[:32], actor=text,
                              workspace_id=workspace_id, refs={"text": text}, payload={"i": i, "text": text})
            )  # fmt: skip
            monkeypatch.undo()
    # then each row, in append order, holds what append returned
    chain = writer.chain_for(workspace_id)
    rows = list(AuditEvent.objects.filter(chain=chain, type="test.rows").order_by("id"))
    columns = ["chain", "timestamp", "trace_id", "stage", "summary", "outcome", "workspace_id", "actor",
               "refs", "payload", "entry_hash"]  # fmt: skip
    assert [[getattr(row, c) for c in columns] for row in rows] == [
        [getattr(event, c) for c in columns] for event in events
    ]
    assert rows[1].timestamp == whole_second
    assert sequence_pending() == len(TEXTS)
    result = verify_chain(chain)
    assert (result.ok, result.events, result.waiting) == (True, len(TEXTS), 0)
