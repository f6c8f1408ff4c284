"""Verification, checkpoints and the signing key."""

from __future__ import annotations

import base64
import importlib
import json
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction

from audit import offline_verify, signing, writer
from audit import verify as verify_module
from audit.checkpoints import checkpoint_bytes, checkpoint_write
from audit.models import AuditCheckpoint, AuditEvent
from audit.verify import verify_all, verify_chain


def _events(n: int, workspace_id: int | None = 1) -> list[AuditEvent]:
    return [
        writer.append(
            trace_id="t", type="test.event", summary=f"event {i}", workspace_id=workspace_id, payload={"i": i}
        )
        for i in range(n)
    ]


# --- the chain --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_intact_chains_verify_with_counts():
    _events(5, workspace_id=1)
    _events(3, workspace_id=2)
    checkpoint_write()
    result = verify_all()
    assert result.ok
    assert (result.events, result.checkpoints, len(result.chains)) == (8, 2, 2)


@pytest.mark.django_db
def test_altered_payload_is_named_by_event_id(tamper):
    events = _events(5)
    tamper.set_payload(events[2].id, {"i": 999})
    result = verify_chain("ws-1")
    assert not result.ok
    assert (result.broken.event_id, result.broken.seq) == (events[2].id, 3)
    assert "altered" in result.broken.reason


@pytest.mark.django_db
def test_altered_row_with_recomputed_hash_breaks_the_next_link(tamper):
    events = _events(4)
    row = AuditEvent.objects.get(pk=events[1].id)
    fields = {name: getattr(row, name) for name in writer.HASHED_FIELDS}
    fields["payload"] = {"i": 999}
    tamper.set_payload(row.id, {"i": 999})
    with connection.cursor() as cursor:  # a careful attacker reseals the entry and rehashes the row
        cursor.execute(
            "UPDATE audit_auditevent SET hash = %s, entry_hash = %s WHERE id = %s",
            [bytes.fromhex(writer.event_hash(fields)), bytes.fromhex(writer.entry_hash(fields)), row.id],
        )
    result = verify_chain("ws-1")
    assert result.broken.event_id == events[2].id
    assert "prev_hash" in result.broken.reason


@pytest.mark.django_db
def test_deleted_middle_row_is_a_seq_gap(tamper):
    events = _events(5)
    tamper.delete_events([events[2].id])
    result = verify_chain("ws-1")
    assert (result.broken.event_id, result.broken.seq) == (events[3].id, 4)
    assert "seq gap" in result.broken.reason


@pytest.mark.django_db
def test_deleted_tail_with_head_left_alone_is_detected_by_the_head(tamper):
    events = _events(5)
    tamper.delete_events([events[3].id, events[4].id])
    result = verify_chain("ws-1")
    assert not result.ok
    assert "head row says seq 5" in result.broken.reason
    assert result.broken.event_id == events[2].id


@pytest.mark.django_db
def test_tail_truncation_with_rewound_head_is_caught_by_the_checkpoint(tamper):
    # given a checkpoint at seq 6
    events = _events(6)
    (checkpoint,) = checkpoint_write()
    assert checkpoint.seq == 6
    # when the newest two rows are deleted and the head row rewound to look consistent
    tamper.delete_events([events[4].id, events[5].id])
    tamper.rewind_head("ws-1", events[3])
    # then only the checkpoint shows it, and verification names it
    result = verify_chain("ws-1")
    assert not result.ok
    assert result.broken.checkpoint_id == checkpoint.id
    assert f"no longer reaches checkpoint #{checkpoint.id}" in result.broken.reason


@pytest.mark.django_db
def test_forged_checkpoint_signature_is_detected():
    _events(2)
    (checkpoint,) = checkpoint_write()
    other_key = Ed25519PrivateKey.generate()
    data = checkpoint_bytes(
        chain="ws-1", seq=2, head_hash=checkpoint.head_hash, created_at=checkpoint.created_at
    )
    AuditCheckpoint.objects.create(
        chain="ws-1",
        seq=2,
        head_hash=checkpoint.head_hash,
        created_at=checkpoint.created_at,
        key_id=checkpoint.key_id,
        signature=signing.b64url(other_key.sign(data)),
    )
    result = verify_chain("ws-1")
    assert not result.ok
    assert "invalid signature" in result.broken.reason


@pytest.mark.django_db
def test_checkpoint_for_a_head_that_does_not_exist_is_detected():
    events = _events(2)
    data = checkpoint_bytes(chain="ws-1", seq=2, head_hash="f" * 64, created_at=events[1].timestamp)
    key_id, signature = signing.sign(data)
    cp = AuditCheckpoint.objects.create(
        chain="ws-1",
        seq=2,
        head_hash="f" * 64,
        created_at=events[1].timestamp,
        key_id=key_id,
        signature=signature,
    )
    result = verify_chain("ws-1")
    assert result.broken.checkpoint_id == cp.id
    assert result.broken.event_id == events[1].id


@pytest.mark.django_db
def test_checkpoints_are_written_only_for_chains_that_moved():
    _events(2, workspace_id=1)
    _events(2, workspace_id=2)
    assert {cp.chain for cp in checkpoint_write()} == {"ws-1", "ws-2"}
    assert checkpoint_write() == []
    _events(1, workspace_id=2)
    assert [(cp.chain, cp.seq) for cp in checkpoint_write()] == [("ws-2", 3)]
    assert [cp.chain for cp in checkpoint_write("ws-1")] == []


@pytest.mark.django_db
def test_rotation_re_signs_unmoved_chains_with_the_new_key(signing_key_file):
    _events(2)
    (first,) = checkpoint_write()
    old = signing.read_key_file(signing_key_file)
    signing.retire_public_key(old.public_key(), signing_key_file)
    signing.generate_key_file(signing_key_file, force=True)
    (second,) = checkpoint_write()
    assert second.key_id != first.key_id
    assert second.key_id == signing.current_key_id()
    result = verify_all()
    assert result.ok
    assert result.checkpoints == 2


def test_offline_verifier_hashes_exactly_like_the_writer():
    # given fields with nested, unicode and numeric content, as an export line carries them
    fields = {
        "chain": "ws-9", "seq": 12, "timestamp": "2026-11-22T11:33:00.123456+00:00", "trace_id": "tr",
        "stage": "step", "type": "step.succeeded", "summary": "Grüße \u2603 \"quoted\"", "outcome": "success",
        "workspace_id": 9, "refs": {"run": 5, "step": "a"}, "actor": "user:1",
        "payload": {"n": [1, 2.5, 1e-07, None, True], "big": 2**70, "s": "\\"}, "prev_hash": "a" * 64,
    }  # fmt: skip
    assert offline_verify.event_hash(fields) == writer.event_hash(fields)
    cp = {"chain": "ws-9", "seq": 12, "head_hash": "b" * 64, "created_at": "2026-11-22T11:33:00.123456+00:00"}
    assert offline_verify.checkpoint_bytes(cp) == checkpoint_bytes(**cp)


@pytest.mark.django_db
def test_offline_hash_matches_rows_written_through_the_database():
    _events(3)
    for row in AuditEvent.objects.all():
        line = {name: getattr(row, name) for name in writer.HASHED_FIELDS}
        line["timestamp"] = writer.format_timestamp(line["timestamp"])
        assert offline_verify.event_hash(line) == row.hash


# --- the signing key --------------------------------------------------------------------------


def test_key_file_is_private_and_key_id_is_sha256_prefix_of_the_public_key(signing_key_file):
    assert stat.S_IMODE(signing_key_file.stat().st_mode) == 0o600
    key = signing.signing_key()
    assert signing.current_key_id() == signing.key_id_for(key.public_key())
    import hashlib

    assert (
        signing.current_key_id()
        == hashlib.sha256(signing.raw_public_bytes(key.public_key())).hexdigest()[:16]
    )


def test_sign_and_verify_round_trip_and_reject_tampering():
    key_id, signature = signing.sign(b"payload")
    assert signing.verify(key_id, b"payload", signature)
    assert not signing.verify(key_id, b"payload!", signature)
    assert not signing.verify("0" * 16, b"payload", signature)
    assert not signing.verify(key_id, b"payload", "not base64 !!")
    assert not signing.verify(key_id, b"payload", signature[:-4])


def test_old_signature_verifies_after_rotation_when_old_public_key_is_retired(
    settings, signing_key_file, tmp_path
):
    # given a signature made with the old key
    old_key_id, signature = signing.sign(b"approve step 3")
    old_public = signing.signing_key().public_key()
    # when the key is replaced without keeping the old public key
    signing.generate_key_file(signing_key_file, force=True)
    # then the old signature no longer verifies
    assert signing.current_key_id() != old_key_id
    assert not signing.verify(old_key_id, b"approve step 3", signature)
    # and when the old public key is listed as retired, it verifies again (and is published as not current)
    retired = tmp_path / "old.pub.pem"
    retired.write_text(signing.public_pem(old_public))
    settings.AUTOPLANE_RETIRED_PUBLIC_KEY_FILES = [retired]
    assert signing.verify(old_key_id, b"approve step 3", signature)
    published = {k["key_id"]: k["current"] for k in signing.public_keys()}
    assert published == {signing.current_key_id(): True, old_key_id: False}


def test_key_from_environment_as_pem_or_raw_base64(settings):
    key = Ed25519PrivateKey.generate()
    raw = key.private_bytes_raw()
    expected = signing.key_id_for(key.public_key())
    settings.AUTOPLANE_SIGNING_KEY = base64.b64encode(raw).decode()
    assert signing.current_key_id() == expected
    settings.AUTOPLANE_SIGNING_KEY = signing.private_pem(key).decode()
    assert signing.current_key_id() == expected
    settings.AUTOPLANE_SIGNING_KEY = "bm90IGEga2V5"
    with pytest.raises(ImproperlyConfigured):
        signing.sign(b"x")


def test_missing_key_is_generated_only_where_allowed(settings, tmp_path):
    settings.AUTOPLANE_SIGNING_KEY_FILE = tmp_path / "fresh" / "key.pem"
    settings.AUTOPLANE_SIGNING_KEY_AUTOGENERATE = False
    with pytest.raises(ImproperlyConfigured, match="keygen"):
        signing.sign(b"x")
    settings.AUTOPLANE_SIGNING_KEY_AUTOGENERATE = True
    key_id, _ = signing.sign(b"x")
    assert (tmp_path / "fresh" / "key.pem").exists()
    assert stat.S_IMODE((tmp_path / "fresh" / "key.pem").stat().st_mode) == 0o600
    assert key_id == signing.current_key_id()


def test_public_keys_shape():
    (entry,) = signing.public_keys()
    assert set(entry) == {"key_id", "algorithm", "public_key", "pem", "current"}
    assert entry["algorithm"] == "Ed25519"
    assert entry["current"] is True
    assert len(signing.b64url_decode(entry["public_key"])) == 32
    assert entry["pem"].startswith("-----BEGIN PUBLIC KEY-----")


# --- incremental verification -----------------------------------------------------------------


@pytest.mark.django_db
def test_since_checkpoint_walks_only_the_tail_and_still_catches_tampering_in_it(tamper):
    events = _events(6)
    checkpoint_write()  # at seq 6
    tail = _events(4)
    full, incremental = verify_chain("ws-1"), verify_chain("ws-1", since_checkpoint=True)
    assert full.ok
    assert incremental.ok
    assert (full.events, incremental.events) == (10, 5)  # the checkpointed event and the 4 after it
    tamper.set_payload(tail[2].id, {"i": 999})
    assert verify_chain("ws-1", since_checkpoint=True).broken.event_id == tail[2].id
    # a change below the checkpoint is for the full walk to find
    tamper.set_payload(tail[2].id, {"i": 2})
    tamper.set_payload(events[1].id, {"i": 999})
    assert verify_chain("ws-1", since_checkpoint=True).ok
    assert verify_chain("ws-1").broken.event_id == events[1].id


@pytest.mark.django_db
def test_since_checkpoint_needs_the_checkpointed_event_intact(tamper):
    events = _events(5)
    checkpoint_write()
    tamper.delete_events([events[4].id])
    result = verify_chain("ws-1", since_checkpoint=True)
    assert not result.ok
    assert "checkpoint" in result.broken.reason


@pytest.mark.django_db
def test_without_a_checkpoint_since_checkpoint_is_a_full_walk():
    _events(3)
    assert verify_chain("ws-1", since_checkpoint=True).events == 3


# --- the fast walk ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_fast_walk_hashes_awkward_values_exactly_like_the_writer(monkeypatch):
    awkward = {
        "text": 'quote " backslash \\ newline \n tab \t nul-ish \x01 \u2028 é 日本 🙂',
        "numbers": [0, -1, 1.5, 1e-07, 2.5e300, 10**20, -0.0, True, None],
        "nested": {"b": {"z": 1, "a": [{"y": 2, "x": 3}]}, "a": [], "": {}},
        "zz": 1, "Z": 2, "é": 3, "e": 4,
    }  # fmt: skip
    writer.append(trace_id="t\u00e9", type="x.y", summary='s "q" \\ é', workspace_id=1, stage="st",
                  refs={"run": "r1", "n": 5}, actor="user:ü", payload=awkward)  # fmt: skip
    writer.append(trace_id="t", type="x.y", summary="platform", workspace_id=None, payload={"list": [1, "a"]})
    _events(3)

    def slow_path(event_id, column):
        raise AssertionError(f"event {event_id}: the fast {column} differs from the writer's")

    monkeypatch.setattr(verify_module, "_slow_check", slow_path)
    if connection.vendor == "postgresql":
        # PostgreSQL hashes every row itself: none may need the Python hasher either.
        monkeypatch.setattr(verify_module._ChainHasher, "event", slow_path)
        monkeypatch.setattr(verify_module._ChainHasher, "entry", slow_path)
    checkpoint_write("ws-1")
    writer.append(trace_id="t", type="x.y", summary="sealed tail", workspace_id=1, payload=awkward)
    result = verify_all()
    assert result.ok, result.summary()
    assert result.events == 6


@pytest.mark.django_db
def test_a_resealed_entry_above_the_newest_checkpoint_is_caught_by_its_seal(tamper):
    events = _events(3)
    checkpoint_write()  # at seq 3
    tail = _events(2)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"\x01" * 32, tail[0].id]
        )
    result = verify_chain("ws-1")
    assert (result.broken.event_id, result.broken.seq) == (tail[0].id, 4)
    assert "entry hash" in result.broken.reason
    # Below the checkpoint the event's hash, vouched for by the signature, is what counts.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"", tail[0].id])
        cursor.execute(
            "UPDATE audit_auditevent SET entry_hash = %s WHERE id = %s", [b"\x01" * 32, events[0].id]
        )
    assert verify_chain("ws-1").ok


@pytest.mark.django_db(transaction=True)
def test_chains_verified_in_parallel_report_the_broken_one(tamper):
    _events(4, workspace_id=1)
    second = _events(4, workspace_id=2)
    _events(4, workspace_id=3)
    result = verify_all(jobs=3)
    assert (result.ok, result.events, len(result.chains)) == (True, 12, 3)
    tamper.set_payload(second[1].id, {"i": 999})
    result = verify_all(jobs=3)
    assert (result.broken.chain, result.broken.event_id) == ("ws-2", second[1].id)


def _forge(checkpoint: AuditCheckpoint) -> AuditCheckpoint:
    """A second checkpoint of the same statement, signed by a key that is not the platform's."""
    data = checkpoint_bytes(
        chain=checkpoint.chain,
        seq=checkpoint.seq,
        head_hash=checkpoint.head_hash,
        created_at=checkpoint.created_at,
    )
    return AuditCheckpoint.objects.create(
        chain=checkpoint.chain,
        seq=checkpoint.seq,
        head_hash=checkpoint.head_hash,
        created_at=checkpoint.created_at,
        key_id=checkpoint.key_id,
        signature=signing.b64url(Ed25519PrivateKey.generate().sign(data)),
    )


@pytest.mark.django_db
def test_since_checkpoint_checks_the_signature_it_stands_on_and_leaves_older_ones_to_the_full_walk():
    _events(2)
    (old,) = checkpoint_write()
    _events(2)
    (newest,) = checkpoint_write()
    _events(1)
    forged_old = _forge(old)
    assert verify_chain("ws-1", since_checkpoint=True).ok
    assert verify_chain("ws-1").broken.checkpoint_id == forged_old.id
    forged_newest = _forge(newest)
    result = verify_chain("ws-1", since_checkpoint=True)
    assert result.broken.checkpoint_id == forged_newest.id
    assert "invalid signature" in result.broken.reason


# --- refs and payload as the hashed JSON text ---------------------------------------------------


@pytest.mark.django_db
def test_refs_and_payload_are_stored_as_the_canonical_text_that_was_hashed():
    event = writer.append(trace_id="t", type="x.y", summary="s", workspace_id=1,
                          refs={"run": "r1", "b": [1, 2]}, payload={"z": {"é": 1.5, "a": None}})  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute("SELECT refs, payload FROM audit_auditevent WHERE id = %s", [event.id])
        refs, payload = cursor.fetchone()
    if connection.vendor == "postgresql":  # psycopg parses json; the text itself, through ::text
        with connection.cursor() as cursor:
            cursor.execute("SELECT refs::text, payload::text FROM audit_auditevent WHERE id = %s", [event.id])
            refs, payload = cursor.fetchone()
    assert (refs, payload) == ('{"b":[1,2],"run":"r1"}', '{"z":{"a":null,"é":1.5}}')
    assert AuditEvent.objects.get(pk=event.id).payload == {"z": {"é": 1.5, "a": None}}


@pytest.mark.django_db
def test_a_row_whose_json_text_is_not_canonical_but_whose_value_is_intact_is_judged_by_value(
    tamper, monkeypatch
):
    """A legacy row (jsonb's text after migration 0010), or one re-spaced by someone who dropped the
    guard: PostgreSQL's hash of the stored text differs, the Python path judges the value: intact."""
    events = _events(3)
    writer.append(trace_id="t", type="x.y", summary="s", workspace_id=1, refs={"run": "r1", "step": "a"})
    tamper.set_json_text(events[1].id, "payload", '{ "i" : 1 }')  # same value, other text
    tamper.set_json_text(events[2].id, "payload", '{"i": 2}')
    judged = []
    hasher_event = verify_module._ChainHasher.event

    def spy(self, seq, prev, content):
        judged.append(seq)
        return hasher_event(self, seq, prev, content)

    monkeypatch.setattr(verify_module._ChainHasher, "event", spy)
    result = verify_chain("ws-1")
    assert result.ok, result.summary()
    assert result.events == 4
    if connection.vendor == "postgresql":
        assert judged == [2, 3]  # only the two rows whose text PostgreSQL could not match
    # A different value is reported, whatever its spacing.
    tamper.set_json_text(events[1].id, "payload", '{ "i" : 7 }')
    assert (verify_chain("ws-1").broken.event_id, verify_chain("ws-1").broken.seq) == (events[1].id, 2)


@pytest.mark.django_db
def test_an_edited_refs_text_is_reported(tamper):
    events = _events(2)
    tamper.set_json_text(events[0].id, "refs", '{"run":"another"}')
    result = verify_chain("ws-1")
    assert (result.broken.event_id, result.broken.seq) == (events[0].id, 1)
    assert "content does not match its hash" in result.broken.reason


@pytest.mark.django_db
def test_swapped_contents_of_two_rows_are_reported():
    events = _events(3)
    with connection.cursor() as cursor:
        cursor.execute(
            "DROP TRIGGER IF EXISTS audit_append_only_row ON audit_auditevent"
            if connection.vendor == "postgresql"
            else "DROP TRIGGER IF EXISTS audit_no_update"
        )
        cursor.execute(
            "UPDATE audit_auditevent SET seq = seq + 1000 WHERE id IN (%s, %s)", [events[0].id, events[1].id]
        )
        cursor.execute("UPDATE audit_auditevent SET seq = 2 WHERE id = %s", [events[0].id])
        cursor.execute("UPDATE audit_auditevent SET seq = 1 WHERE id = %s", [events[1].id])
    result = verify_chain("ws-1")
    assert (result.broken.event_id, result.broken.seq) == (events[1].id, 1)


@pytest.mark.django_db
def test_the_guard_refuses_a_whitespace_only_edit_of_json_text():
    (event,) = _events(1)
    cast = "::json" if connection.vendor == "postgresql" else ""
    for column, text in (("payload", '{"i": 0}'), ("refs", "{ }")):
        with (
            pytest.raises(Exception, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(f"UPDATE audit_auditevent SET {column} = %s{cast} WHERE id = %s", [text, event.id])
    assert verify_chain("ws-1").ok


@pytest.mark.django_db
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="migration 0010 converts jsonb on PostgreSQL only"
)
def test_migration_0010_writes_existing_jsonb_as_the_writers_canonical_text():
    migration = importlib.import_module("audit.migrations.0010_json_text")
    values = [
        {}, [], {"run": "r1", "automation": "5", "step": "fetch"},
        {"zz": 1, "Z": 2, "é": 3, "e": 4, "": [], "aa": {"b": [True, None, {"y": 2, "x": "q\"\\\n\u2028🙂\x01"}]}},
        {"n": [0, -1, 10**20, 1.5, 3.25]},
    ]  # fmt: skip
    with connection.cursor() as cursor:
        cursor.execute(migration._CANONICAL_FN)
        for value in values:
            cursor.execute("SELECT pg_temp.audit_canonical_json(%s::jsonb)", [json.dumps(value)])
            assert cursor.fetchone()[0] == writer.canonical_json(value)


@pytest.mark.django_db
def test_key_lookups_on_refs_and_payload_still_work():
    event = writer.append(trace_id="t", type="x.y", summary="s", workspace_id=1,
                          refs={"run": "r1", "step": "a"}, payload={"x": {"y": 1}})  # fmt: skip
    assert list(AuditEvent.objects.filter(refs__step="a", payload__x__y=1).values_list("id", flat=True)) == [
        event.id
    ]
    assert not AuditEvent.objects.filter(refs__step="b").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("checkpoints", [1, 300])
def test_a_consistently_rewritten_tail_is_caught_by_a_checkpoint_in_the_middle(tamper, checkpoints):
    """Rows rewritten with every hash and link recomputed pass every per-row check (PostgreSQL's
    walk returns none of them); the signed checkpoint at seq 3 still names the old hash."""
    events = _events(3)
    for _ in range(checkpoints):  # many checkpoints of one head: each is checked
        checkpoint_write("ws-1")
    _events(3)
    rows = list(AuditEvent.objects.filter(chain="ws-1").order_by("seq"))
    prev = rows[1].hash
    with connection.cursor() as cursor:
        for n, row in enumerate(rows[2:]):
            fields = {name: getattr(row, name) for name in writer.HASHED_FIELDS}
            if n == 0:
                fields["payload"] = {"i": 999}
                tamper.set_json_text(row.id, "payload", writer.canonical_json({"i": 999}))
            fields["prev_hash"] = prev
            prev = writer.event_hash(fields)
            cursor.execute(
                "UPDATE audit_auditevent SET prev_hash = %s, hash = %s WHERE id = %s",
                [bytes.fromhex(fields["prev_hash"]), bytes.fromhex(prev), row.id],
            )
        cursor.execute("UPDATE audit_auditchainhead SET head_hash = %s WHERE chain = 'ws-1'", [prev])
    result = verify_chain("ws-1")
    assert (result.broken.event_id, result.broken.seq) == (events[2].id, 3), result.summary()
    assert "signed in checkpoint" in result.broken.reason


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="ranges are walked in parallel on PostgreSQL only"
)
def test_one_chain_walked_in_parallel_ranges_gives_the_result_of_one_walk(tamper, monkeypatch):
    monkeypatch.setattr(verify_module, "_RANGE_MIN", 3)
    events = _events(10)
    assert verify_module._ranges(1, 10, 3) == [(1, 4), (4, 7), (7, None)]
    for jobs in (1, 3):
        result = verify_all(jobs=jobs)
        assert (result.ok, result.events, len(result.chains)) == (True, 10, 1)
    # a row edited in the second range, then a range's first row deleted: reported as by one walk
    tamper.set_json_text(events[4].id, "payload", '{"i":999}')
    assert [(r.broken.event_id, r.broken.seq) for r in (verify_all(jobs=1), verify_all(jobs=3))] == [
        (events[4].id, 5)
    ] * 2
    tamper.set_json_text(events[4].id, "payload", '{"i":4}')
    assert verify_all(jobs=3).ok
    tamper.delete_events([events[3].id])
    broken = [verify_all(jobs=jobs).broken for jobs in (1, 3)]
    assert [(b.event_id, b.seq) for b in broken] == [(events[4].id, 5)] * 2
    assert "seq gap" in broken[1].reason
    tamper.restore()
