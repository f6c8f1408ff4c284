"""The sequencer: appends are plain inserts; the sequencer chains them, in order, exactly once."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.test.utils import CaptureQueriesContext

from audit import writer
from audit.models import AuditChainHead, AuditEvent
from audit.sequencer import FILL_ROWS, EntryTampered, backlog, sequence_chain, sequence_pending
from audit.verify import verify_chain
from ops.health import health_report
from tests.live import live_worker_env

pytestmark = pytest.mark.unsequenced
BASE_DIR = settings.BASE_DIR


def _append(n: int, workspace_id: int = 1) -> list[AuditEvent]:
    return [
        writer.append(
            trace_id="t", type="test.event", summary=f"#{i}", workspace_id=workspace_id, payload={"i": i}
        )
        for i in range(n)
    ]


def _refused(sql: str, params: list) -> None:
    with (
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(sql, params)


@pytest.mark.django_db
def test_an_append_is_one_insert_that_leaves_the_chain_head_alone():
    with CaptureQueriesContext(connection) as queries:
        event = writer.append(trace_id="t", type="test.event", summary="x", workspace_id=1)
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["INSERT"]
    stored = AuditEvent.objects.get(pk=event.id)
    assert (stored.seq, stored.prev_hash, stored.hash) == (None, None, None)
    assert stored.entry_hash == writer.entry_hash({f: getattr(stored, f) for f in writer.CONTENT_FIELDS})
    assert not AuditChainHead.objects.exists()


@pytest.mark.django_db
def test_several_events_of_a_transaction_go_in_one_statement_in_order():
    with transaction.atomic(), CaptureQueriesContext(connection) as queries, writer.batch():
        _append(5)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1
    assert [e.payload["i"] for e in AuditEvent.objects.order_by("id")] == [0, 1, 2, 3, 4]


@pytest.mark.django_db
def test_sequencing_chains_waiting_entries_in_order_and_verification_reports_the_rest():
    # given five entries waiting
    events = _append(5)
    waiting = verify_chain("ws-1")
    assert (waiting.ok, waiting.events, waiting.waiting) == (True, 0, 5)
    # when the sequencer chains three of them, then the rest
    assert sequence_chain("ws-1", limit=3) == 3
    partial = verify_chain("ws-1")
    assert (partial.ok, partial.events, partial.waiting) == (True, 3, 2)
    assert sequence_pending() == 2
    # then the chain is the append order, linked, and the head names its end
    stored = list(AuditEvent.objects.filter(chain="ws-1").order_by("seq"))
    assert [e.id for e in stored] == [e.id for e in events]
    assert [e.seq for e in stored] == [1, 2, 3, 4, 5]
    assert stored[0].prev_hash == writer.GENESIS_HASH
    assert [e.prev_hash for e in stored[1:]] == [e.hash for e in stored[:-1]]
    assert AuditChainHead.objects.get(chain="ws-1").head_hash == stored[-1].hash
    result = verify_chain("ws-1")
    assert (result.ok, result.events, result.waiting) == (True, 5, 0)
    assert sequence_pending() == 0


@pytest.mark.django_db
def test_the_database_refuses_changes_but_the_one_time_fill(tamper):
    (waiting,) = _append(1)
    tamper.restore()
    # content of a waiting entry, its deletion, and a fill that also changes content: refused
    _refused("UPDATE audit_auditevent SET summary = 'forged' WHERE id = %s", [waiting.id])
    _refused("DELETE FROM audit_auditevent WHERE id = %s", [waiting.id])
    _refused(
        "UPDATE audit_auditevent SET seq = 1, prev_hash = %s, hash = %s, summary = 'x' WHERE id = %s",
        [bytes(32), b"\xaa" * 32, waiting.id],
    )
    # the sequencer's fill: allowed once; a second fill or a change of a sequenced row: refused
    sequence_pending()
    sequenced = AuditEvent.objects.get(pk=waiting.id)
    _refused("UPDATE audit_auditevent SET seq = 7 WHERE id = %s", [sequenced.id])
    _refused("UPDATE audit_auditevent SET hash = %s WHERE id = %s", [b"\xbb" * 32, sequenced.id])
    _refused("DELETE FROM audit_auditevent WHERE id = %s", [sequenced.id])
    assert verify_chain("ws-1").ok


@pytest.mark.django_db
def test_the_fill_clears_the_entry_hash_and_the_guard_allows_only_that(tamper):
    first, second = _append(2)
    tamper.restore()
    # the seal alone, outside a fill: refused (cleared, or replaced)
    _refused("UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"", first.id])
    _refused("UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"\xcc" * 32, first.id])
    # a fill that replaces the seal instead of clearing it: refused
    _refused(
        "UPDATE audit_auditevent SET seq = 1, prev_hash = %s, hash = %s, entry_hash = %s WHERE id = %s",
        [bytes(32), b"\xaa" * 32, b"\xcc" * 32, first.id],
    )
    assert AuditEvent.objects.get(pk=first.id).entry_hash  # waiting: still sealed
    sequence_pending()
    # chained: the seal is gone, the hash covers the content
    assert [e.entry_hash for e in AuditEvent.objects.filter(pk__in=[first.id, second.id])] == ["", ""]
    # ... and cannot come back
    _refused("UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"\xcc" * 32, first.id])
    assert verify_chain("ws-1").ok


@pytest.mark.django_db
def test_a_large_batch_is_filled_in_short_statements_of_one_transaction():
    # given more waiting entries than one fill statement takes
    events = _append(2 * FILL_ROWS + 10)
    # when the sequencer takes them as one batch
    with CaptureQueriesContext(connection) as queries:
        assert sequence_chain("ws-1") == 2 * FILL_ROWS + 10
    # then they were filled in statements of at most FILL_ROWS rows
    fills = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE audit_auditevent")]
    assert len(fills) == 3
    # and they form one chain in append order that verifies
    result = verify_chain("ws-1")
    assert (result.ok, result.events, result.waiting) == (True, 2 * FILL_ROWS + 10, 0)
    assert [e.id for e in AuditEvent.objects.filter(chain="ws-1").order_by("seq")] == [e.id for e in events]


@pytest.mark.django_db
def test_an_altered_waiting_entry_is_reported_and_never_chained(tamper):
    # given three waiting entries, the second altered behind the database's back
    events = _append(3)
    tamper.set_payload(events[1].id, {"i": 999})
    # then verification names it
    result = verify_chain("ws-1")
    assert result.broken.event_id == events[1].id
    assert "waiting entry" in result.broken.reason
    # and the sequencer chains the entry before it, then refuses it
    with pytest.raises(EntryTampered):
        sequence_chain("ws-1")
    assert list(AuditEvent.objects.filter(seq__isnull=False).values_list("id", flat=True)) == [events[0].id]
    assert sequence_pending() == 0  # the chain stays stopped, visibly


@pytest.mark.django_db
def test_swapped_waiting_contents_are_detected(tamper):
    events = _append(2)
    with connection.cursor() as cursor:  # swap the two payloads, leaving each row's sealed entry hash
        cursor.execute("UPDATE audit_auditevent SET payload = %s WHERE id = %s", ['{"i": 1}', events[0].id])
        cursor.execute("UPDATE audit_auditevent SET payload = %s WHERE id = %s", ['{"i": 0}', events[1].id])
    assert verify_chain("ws-1").broken.event_id == events[0].id


@pytest.mark.django_db
def test_audit_verify_reports_entries_waiting(capsys):
    _append(2)
    call_command("audit_verify")
    assert "2 entries waiting for the sequencer" in capsys.readouterr().out


@pytest.mark.django_db
def test_healthz_degrades_when_entries_wait_past_the_max_merge_delay(settings):
    _append(1)
    settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS = -1.0  # any waiting entry is past it
    report = health_report()
    assert "audit_sequencer" in report["failing"]
    assert report["checks"]["audit_sequencer"]["waiting_entries"] == 1
    sequence_pending()
    settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS = 1.0
    assert health_report()["checks"]["audit_sequencer"]["ok"] is True
    assert backlog().entries == 0


@pytest.mark.timeout(300)
def test_a_sequencer_killed_mid_batch_loses_nothing_and_sequences_nothing_twice(committed_ledger):
    # given 6,000 waiting entries
    total = 6000
    for start in range(0, total, 500):
        with transaction.atomic(), writer.batch():
            for i in range(start, start + 500):
                writer.append(
                    trace_id="t", type="test.kill", summary=f"#{i}", workspace_id=77, payload={"i": i}
                )
    env = live_worker_env(AUTOPLANE_AUDIT_SEQUENCE_BATCH="400")
    kills, progress = 0, []
    # when a sequencer is SIGKILLed as soon as it has made progress, again and again
    while kills < 5:
        before = AuditEvent.objects.filter(seq__isnull=False).count()
        if before == total:
            break
        process = subprocess.Popen([sys.executable, "manage.py", "audit_sequencer"], env=env, cwd=BASE_DIR,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 120
        while AuditEvent.objects.filter(seq__isnull=False).count() == before:
            assert process.poll() is None, "the sequencer exited"
            assert time.monotonic() < deadline, "the sequencer made no progress"
            time.sleep(0.005)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        kills += 1
        # then each kill leaves a consistent, verifiable prefix that the head row agrees with
        sequenced = AuditEvent.objects.filter(seq__isnull=False).count()
        assert AuditChainHead.objects.get(chain="ws-77").seq == sequenced
        assert verify_chain("ws-77").ok
        progress.append(sequenced)
    assert kills >= 2
    assert progress[0] < total
    # and a last pass completes one valid chain: nothing lost, nothing sequenced twice
    sequence_pending()
    seqs = list(AuditEvent.objects.filter(chain="ws-77").order_by("id").values_list("seq", flat=True))
    assert None not in seqs
    assert sorted(seqs) == list(range(1, total + 1))
    payloads = AuditEvent.objects.filter(chain="ws-77").order_by("seq").values_list("payload", flat=True)
    assert [p["i"] for p in payloads] == list(range(total))
    result = verify_chain("ws-77")
    assert result.ok, result.broken
    assert (result.events, result.waiting) == (total, 0)


@pytest.mark.django_db
def test_the_looping_sequencer_lowers_its_cpu_priority_and_once_does_not(settings, monkeypatch):
    from audit.management.commands import audit_sequencer

    niced, loops = [], []
    monkeypatch.setattr(audit_sequencer.os, "nice", niced.append)
    monkeypatch.setattr(audit_sequencer, "run_forever", lambda **kw: loops.append(kw["interval"]))
    settings.AUTOPLANE_AUDIT_SEQUENCER_NICE = 10

    call_command("audit_sequencer", "--once", stdout=io.StringIO())
    assert niced == []
    call_command("audit_sequencer", stdout=io.StringIO())
    assert niced == [10]
    assert loops == [settings.AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS]

    settings.AUTOPLANE_AUDIT_SEQUENCER_NICE = 0
    call_command("audit_sequencer", stdout=io.StringIO())
    assert niced == [10]


@pytest.mark.django_db
def test_the_looping_sequencer_gives_back_the_signal_handlers_it_took(monkeypatch):
    """Run in-process, it must not leave its stop handler behind: a process forked later (audit_verify's
    range walkers) would inherit it and survive its pool's SIGTERM, hanging the pool's exit."""
    from audit.management.commands import audit_sequencer

    seen = {}
    monkeypatch.setattr(audit_sequencer.os, "nice", lambda n: None)
    monkeypatch.setattr(
        audit_sequencer, "run_forever", lambda **kw: seen.update(term=signal.getsignal(signal.SIGTERM))
    )
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    call_command("audit_sequencer", stdout=io.StringIO())

    assert seen["term"] not in (before[signal.SIGTERM], signal.SIG_DFL)  # it did take SIGTERM while looping
    assert {sig: signal.getsignal(sig) for sig in before} == before


@pytest.mark.parametrize(
    ("variable", "value"),
    [("AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS", "1.0"), ("AUTOPLANE_AUDIT_SEQUENCER_NICE", "20")],
)
def test_settings_refuse_a_cadence_that_breaks_the_bound_or_a_bad_nice(variable, value):
    env = {**os.environ, variable: value, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        env=env,
        cwd=BASE_DIR,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert f"ImproperlyConfigured: {variable} must be" in result.stderr
