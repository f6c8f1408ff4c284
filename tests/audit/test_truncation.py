"""Audit ledger truncation: the signed anchor, the delete guard, and verification after a cut."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from audit import anchors, offline_verify, signing, writer
from audit.checkpoints import ANCHOR_KIND, ANCHOR_TYPE, anchor_bytes, checkpoint_write, newest_anchor
from audit.export import export_jsonl
from audit.models import AuditEvent
from audit.verify import verify_chain

LATER = timedelta(
    days=31
)  # "now" for the truncation pass: every checkpoint written in the test is older than 30 days


def _events(n: int, workspace_id: int = 1) -> list[AuditEvent]:
    return [
        writer.append(
            trace_id="t", type="test.event", summary=f"e{i}", workspace_id=workspace_id, payload={"i": i}
        )
        for i in range(n)
    ]


def _raw_delete(where: str, params: list) -> None:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM audit_auditevent WHERE {where}", params)  # noqa: S608


@pytest.fixture(autouse=True)
def export_dir(settings, tmp_path):
    settings.AUTOPLANE_AUDIT_EXPORT_DIR = str(tmp_path / "exports")
    return tmp_path / "exports"


def _truncate(chain: str = "ws-1") -> anchors.Truncation:
    return anchors.truncate_chain(chain, days=30, now=timezone.now() + LATER)


@pytest.mark.django_db
def test_verify_and_export_pass_after_truncation(tmp_path):
    _events(5)
    checkpoint_write()  # at seq 5
    _events(3)
    result = _truncate()
    assert (result.from_seq, result.exported, result.deleted) == (6, 5, 5)
    seqs = list(AuditEvent.objects.filter(chain="ws-1").order_by("seq").values_list("seq", "type"))
    assert seqs == [(6, "test.event"), (7, "test.event"), (8, "test.event"), (9, ANCHOR_TYPE)]
    anchor = newest_anchor("ws-1")
    assert (anchor.payload["seq"], anchor.payload["kind"]) == (6, ANCHOR_KIND)
    verified = verify_chain("ws-1")
    assert verified.ok, verified.summary()
    assert verified.events == 4
    assert verify_chain("ws-1", since_checkpoint=True).ok
    _events(2)
    checkpoint_write()
    assert verify_chain("ws-1").ok
    assert verify_chain("ws-1", since_checkpoint=True).ok

    path = tmp_path / "after.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        export_jsonl(fh, ["ws-1"])
    report = offline_verify.verify_export(str(path))
    assert report.events == 6
    assert report.ends["ws-1"][0] == 11


@pytest.mark.django_db
def test_a_second_cut_archives_the_previous_anchor_and_verifies():
    _events(3)
    checkpoint_write()
    _events(2)
    first = _truncate()
    _events(2)
    checkpoint_write()  # covers the first anchor (seq 6)
    second = _truncate()
    assert (first.from_seq, second.from_seq) == (4, 9)
    assert AuditEvent.objects.filter(chain="ws-1", seq__lt=9).count() == 0
    anchors.verify_prefix(second.file, newest_anchor("ws-1").payload)
    assert verify_chain("ws-1").ok


@pytest.mark.django_db
def test_truncation_never_deletes_rows_not_covered_by_an_old_signed_checkpoint():
    _events(4)
    assert _truncate().from_seq == 0  # no checkpoint at all: nothing happens
    checkpoint_write()  # at seq 4, but younger than the window
    _events(3)
    assert anchors.truncate_chain("ws-1", days=30).from_seq == 0
    assert AuditEvent.objects.filter(chain="ws-1").count() == 7
    assert anchors.truncate_all() == []  # AUTOPLANE_AUDIT_RETENTION_DAYS unset: off
    result = _truncate()
    assert result.from_seq == 5  # rows 5..7 came after the checkpoint: kept
    assert list(AuditEvent.objects.filter(chain="ws-1", seq__lt=8).values_list("seq", flat=True)) == [5, 6, 7]


@pytest.mark.django_db
def test_the_database_refuses_deletes_without_an_anchor_and_above_it():
    _events(3)
    _events(2, workspace_id=2)
    with pytest.raises(DatabaseError):
        _raw_delete("chain = %s AND seq = 1", ["ws-1"])
    checkpoint_write()
    _events(1)
    _truncate()  # ws-1 continues from seq 4; ws-2 too, on its own anchor
    with pytest.raises(DatabaseError):
        _raw_delete("chain = %s AND seq = 4", ["ws-1"])
    assert AuditEvent.objects.filter(chain="ws-2").count() == 2
    with pytest.raises(DatabaseError):
        _raw_delete("chain = %s", ["ws-2"])  # ws-1's anchor does not let ws-2's rows go
    assert AuditEvent.objects.filter(chain="ws-2").count() == 2


@pytest.mark.django_db
def test_a_forged_anchor_is_detected_by_verify():
    _events(4)
    checkpoint_write()
    statement = {"chain": "ws-1", "created_at": timezone.now().isoformat(), "kind": ANCHOR_KIND,
                 "prev_hash": "f" * 64, "seq": 3}  # fmt: skip
    forged = {**statement, "key_id": signing.current_key_id(), "signature": "A" * 86}
    writer.append(trace_id="x", type=ANCHOR_TYPE, summary="forged", workspace_id=1, payload=forged)
    _raw_delete("chain = %s AND seq < 3", ["ws-1"])  # the guard only sees that an anchor row exists
    result = verify_chain("ws-1")
    assert not result.ok
    assert "forged or edited" in result.broken.reason

    # Signed with the real key but not backed by the checkpoint (the attacker cannot sign; a bug could).
    key_id, signature = signing.sign(anchor_bytes({**statement, "seq": 4}))
    payload = {**statement, "seq": 4, "key_id": key_id, "signature": signature}
    writer.append(trace_id="y", type=ANCHOR_TYPE, summary="unbacked", workspace_id=1, payload=payload)
    result = verify_chain("ws-1")
    assert not result.ok
    assert "not backed by a signed checkpoint" in result.broken.reason


@pytest.mark.django_db
def test_an_edited_anchor_is_detected_by_verify_and_offline(tamper, tmp_path):
    _events(3)
    checkpoint_write()
    _truncate()
    anchor = newest_anchor("ws-1")
    tamper.set_payload(anchor.id, {**anchor.payload, "seq": 2})
    result = verify_chain("ws-1")
    assert not result.ok
    assert "forged or edited" in result.broken.reason
    path = tmp_path / "edited.jsonl"
    with open(path, "w", encoding="utf-8") as fh:
        export_jsonl(fh, ["ws-1"])
    with pytest.raises(offline_verify.Broken, match="forged or edited"):
        offline_verify.verify_export(str(path))


@pytest.mark.django_db
def test_an_exported_prefix_verifies_against_the_anchor_that_replaced_it(tmp_path, capsys):
    _events(5)
    checkpoint_write()
    result = _truncate()
    payload = newest_anchor("ws-1").payload
    report = anchors.verify_prefix(result.file, payload)
    assert report.events == 5
    assert report.ends["ws-1"] == (5, payload["prev_hash"])

    anchor_file = tmp_path / "anchor.json"
    anchor_file.write_text(json.dumps(payload))
    assert offline_verify.main([result.file, "--continued-by", str(anchor_file)]) == 0
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({**payload, "prev_hash": "0" * 64}))  # not what was signed
    assert offline_verify.main([result.file, "--continued-by", str(wrong)]) == 1
    assert "invalid signature" in capsys.readouterr().out
    key_id, signature = signing.sign(anchor_bytes({**payload, "seq": 7}))
    with pytest.raises(offline_verify.Broken, match="ends at"):
        anchors.verify_prefix(result.file, {**payload, "seq": 7, "key_id": key_id, "signature": signature})


@pytest.mark.django_db
def test_audit_truncate_command(settings, capsys):
    call_command("audit_truncate")
    assert "retention is off" in capsys.readouterr().out
    _events(2)
    checkpoint_write()
    call_command("audit_truncate", "--days", "30")  # the checkpoint is seconds old: nothing to cut
    assert AuditEvent.objects.filter(chain="ws-1").count() == 2
