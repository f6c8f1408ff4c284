"""The writer: hash chaining, redaction, payload cap, append-only storage, concurrent appends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from audit import writer
from audit.checkpoints import checkpoint_write
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_chain

BASE_DIR = Path(settings.BASE_DIR)


def _stored_fields(event: AuditEvent) -> dict:
    return {name: getattr(event, name) for name in writer.HASHED_FIELDS}


@pytest.mark.django_db
def test_append_links_each_event_to_the_previous_one():
    # when three events are appended to one workspace's chain
    events = [
        writer.append(trace_id="t1", type="test.step", summary=f"step {i}", workspace_id=7) for i in range(3)
    ]
    # then they are numbered 1..3, each linked to the previous hash, each hash reproducible from the row
    stored = list(AuditEvent.objects.filter(chain="ws-7").order_by("seq"))
    assert [e.seq for e in stored] == [1, 2, 3]
    assert stored[0].prev_hash == writer.GENESIS_HASH
    assert [e.prev_hash for e in stored[1:]] == [e.hash for e in stored[:-1]]
    for returned, row in zip(events, stored, strict=True):
        assert returned.id == row.id
        assert returned.hash == row.hash
        assert writer.event_hash(_stored_fields(row)) == row.hash
    head = AuditChainHead.objects.get(chain="ws-7")
    assert (head.seq, head.head_hash) == (3, stored[-1].hash)


@pytest.mark.django_db
def test_each_workspace_and_the_platform_have_their_own_chain():
    writer.append(trace_id="t", type="a", summary="a", workspace_id=1)
    writer.append(trace_id="t", type="b", summary="b", workspace_id=2)
    writer.append(trace_id="t", type="c", summary="c")
    writer.append(trace_id="t", type="d", summary="d", workspace_id=1)
    chains = dict(AuditChainHead.objects.values_list("chain", "seq"))
    assert chains == {"ws-1": 2, "ws-2": 1, "platform": 1}


@pytest.mark.django_db
def test_json_that_the_database_would_reshape_still_rehashes_to_its_hash():
    # given values jsonb would store differently (exponents, -0.0), non-JSON floats, NUL and unicode
    payload = {
        "big": 1e100, "tiny": 1e-7, "neg_zero": -0.0, "nan": float("nan"), "inf": float("-inf"),
        "huge_int": 2**70, "pi": 3.141592653589793, "text": "nul\x00 snow \u2603 ünïcode",
        "nested": [{"k": [1, 2.5, None, True, False]}], "when": timezone.now(),
    }  # fmt: skip
    event = writer.append(trace_id="t", type="test.awkward", summary="s\x00", payload=payload, workspace_id=3)
    # when it is read back from the database
    row = AuditEvent.objects.get(pk=event.id)
    # then the stored row hashes to its hash and the chain verifies
    assert writer.event_hash(_stored_fields(row)) == row.hash
    assert row.payload == event.payload
    assert verify_chain("ws-3").ok


@pytest.mark.django_db
def test_declared_secrets_are_redacted_from_summary_refs_and_payload():
    secret = "sk-live-0123456789abcdef"
    event = writer.append(
        trace_id="t",
        type="credential.used",
        summary=f"called with {secret}",
        refs={"token": secret, "nested": [f"Bearer {secret}"]},
        payload={"headers": {"Authorization": f"Bearer {secret}"}, secret: "as a key"},
        secrets=[secret],
    )
    row = AuditEvent.objects.get(pk=event.id)
    stored = json.dumps([row.summary, row.refs, row.payload])
    assert secret not in stored
    assert row.summary == "called with [REDACTED]"
    assert row.payload["headers"]["Authorization"] == "Bearer [REDACTED]"
    assert row.refs["nested"] == ["Bearer [REDACTED]"]
    assert verify_chain("platform").ok


@pytest.mark.django_db
def test_payload_over_the_cap_is_replaced_by_its_size_digest_and_preview(settings):
    settings.AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES = 1024
    big = {"blob": "x" * 5000}
    event = writer.append(trace_id="t", type="test.big", summary="big", payload=big)
    row = AuditEvent.objects.get(pk=event.id)
    assert row.payload["truncated"] is True
    assert row.payload["original_bytes"] == len(writer.canonical_json(big).encode())
    assert len(row.payload["sha256"]) == 64
    assert len(writer.canonical_json(row.payload).encode()) <= 1024
    small = writer.append(trace_id="t", type="test.small", summary="small", payload={"blob": "x" * 100})
    assert AuditEvent.objects.get(pk=small.id).payload == {"blob": "x" * 100}
    assert verify_chain("platform").ok


@pytest.mark.django_db
def test_append_refuses_events_without_trace_or_with_unknown_outcome():
    with pytest.raises(ValueError, match="trace_id"):
        writer.append(trace_id="", type="x", summary="x")
    with pytest.raises(ValueError, match="outcome"):
        writer.append(trace_id="t", type="x", summary="x", outcome="great")
    with pytest.raises(ValueError, match="trace_id longer"):
        writer.append(trace_id="t" * 65, type="x", summary="x")
    assert not AuditEvent.objects.exists()


@pytest.mark.django_db
def test_an_append_rolled_back_with_its_change_leaves_the_chain_continuous():
    def change_that_fails():
        with transaction.atomic():
            writer.append(trace_id="t", type="lost", summary="lost", workspace_id=5)
            raise RuntimeError("the change failed")

    writer.append(trace_id="t", type="kept", summary="kept", workspace_id=5)
    with pytest.raises(RuntimeError):
        change_that_fails()
    writer.append(trace_id="t", type="kept", summary="kept again", workspace_id=5)
    assert list(AuditEvent.objects.filter(chain="ws-5").values_list("seq", "type")) == [
        (1, "kept"),
        (2, "kept"),
    ]
    assert verify_chain("ws-5").ok


@pytest.mark.django_db
def test_database_refuses_raw_update_of_an_event():
    event = writer.append(trace_id="t", type="x", summary="original")
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("UPDATE audit_auditevent SET summary = %s WHERE id = %s", ["forged", event.id])
    assert AuditEvent.objects.get(pk=event.id).summary == "original"


@pytest.mark.django_db
def test_database_refuses_raw_delete_of_an_event():
    event = writer.append(trace_id="t", type="x", summary="original")
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM audit_auditevent WHERE id = %s", [event.id])
    assert AuditEvent.objects.filter(pk=event.id).exists()


@pytest.mark.django_db
def test_orm_update_and_delete_are_refused_too():
    event = writer.append(trace_id="t", type="x", summary="original")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.id).update(summary="forged")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.id).delete()
    assert AuditEvent.objects.get(pk=event.id).summary == "original"


@pytest.mark.django_db
def test_database_refuses_raw_update_of_a_checkpoint():
    writer.append(trace_id="t", type="x", summary="x")
    (checkpoint,) = checkpoint_write()
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditcheckpoint SET seq = 99 WHERE id = %s", [checkpoint.id])
    assert AuditCheckpoint.objects.get(pk=checkpoint.id).seq == 1


@pytest.mark.django_db
def test_database_refuses_deleting_a_checkpoint_raw_or_through_the_orm():
    writer.append(trace_id="t", type="x", summary="x")
    (checkpoint,) = checkpoint_write()
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM audit_auditcheckpoint WHERE id = %s", [checkpoint.id])
    with pytest.raises(DatabaseError, match="immutable"), transaction.atomic():
        AuditCheckpoint.objects.filter(pk=checkpoint.id).delete()
    assert AuditCheckpoint.objects.filter(pk=checkpoint.id).exists()


# --- concurrent appends from separate OS processes ------------------------------------------

_CHILD = r"""
import os, sys, time
import django
django.setup()
from audit import writer
ready, go, count, name, workspace_id = sys.argv[1:6]
open(ready, "w").close()
deadline = time.monotonic() + 120
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("never told to start")
    time.sleep(0.002)
for i in range(int(count)):
    writer.append(trace_id=f"proc-{name}", type="test.concurrent", summary=f"{name} #{i}",
                  workspace_id=int(workspace_id), payload={"process": name, "i": i})
"""


def _database_url_for_children() -> str:
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(db["NAME"])
        if name == ":memory:" or "mode=memory" in name:
            pytest.skip("the test database is in memory; other processes cannot share it")
        return f"sqlite:///{Path(name).resolve()}"
    user = quote(db.get("USER") or "", safe="")
    password = quote(db.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    return f"postgres://{auth}{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}/{quote(db['NAME'], safe='')}"


@pytest.mark.timeout(300)
def test_four_processes_appending_500_each_keep_one_valid_chain(committed_ledger, tmp_path):
    # given four separate processes pointed at the test database, released together,
    # and a sequencer process chaining while they append
    env = {
        **os.environ,
        "DATABASE_URL": _database_url_for_children(),
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
    }
    go = tmp_path / "go"
    children = []
    for name in "abcd":
        ready = tmp_path / f"ready-{name}"
        args = [sys.executable, "-c", _CHILD, str(ready), str(go), "500", name, "4242"]
        children.append((ready, subprocess.Popen(args, env=env, cwd=BASE_DIR, stderr=subprocess.PIPE)))
    deadline = time.monotonic() + 120
    while not all(ready.exists() for ready, _ in children):
        assert time.monotonic() < deadline, "children did not start"
        assert all(p.poll() is None for _, p in children), [p.stderr.read().decode() for _, p in children]
        time.sleep(0.01)
    sequencer_process = subprocess.Popen(
        [sys.executable, "manage.py", "audit_sequencer"], env={**env, "AUTOPLANE_AUDIT_SEQUENCE_BATCH": "50"},
        cwd=BASE_DIR, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    # when they all append at once
    go.touch()
    try:
        for _, process in children:
            _, stderr = process.communicate(timeout=240)
            assert process.returncode == 0, stderr.decode()[-3000:]
    finally:
        sequencer_process.terminate()
        _, sequencer_errors = sequencer_process.communicate(timeout=60)
    assert b"Traceback" not in sequencer_errors, sequencer_errors.decode()[-3000:]
    sequence_pending()  # whatever the sequencer had not reached yet
    # then there are exactly 2,000 events forming one valid chain, 500 from each process,
    # each process's events in the order it appended them
    events = AuditEvent.objects.filter(chain="ws-4242")
    assert events.count() == 2000
    assert sorted(events.values_list("seq", flat=True)) == list(range(1, 2001))
    for name in "abcd":
        mine = events.filter(trace_id=f"proc-{name}").order_by("seq").values_list("payload", flat=True)
        assert [payload["i"] for payload in mine] == list(range(500))
    result = verify_chain("ws-4242")
    assert result.ok, result.broken
    assert result.events == 2000
    assert AuditChainHead.objects.get(chain="ws-4242").seq == 2000
