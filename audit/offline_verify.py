#!/usr/bin/env python3
"""Verify an autoplane audit export anywhere: standard library + ``cryptography``, no Django.

    python offline_verify.py export.jsonl [--trusted-key key.pem ...]

Exit 0 printing the number of verified events and checkpoints, or exit 1
naming the first broken link (or the checkpoint a chain no longer reaches).

Checks, per chain: seq runs 1, 2, 3... without gaps; each event's hash is
sha256 over the canonical JSON (sorted keys, no whitespace, UTF-8) of its hashed
fields; each ``prev_hash`` is the previous event's hash (64 zeros for seq 1);
every checkpoint's Ed25519 signature is valid and the event at its seq exists
with exactly the signed head hash. By default the public keys in the export's
header are trusted; pass ``--trusted-key`` (PEM files, or fetch them from
``GET /api/v1/keys``) to trust only keys obtained elsewhere, which is what
makes a rewritten export fail.

A truncated chain starts at its newest truncation anchor: an event of type
``audit.anchor`` whose payload is a signed statement "chain C continues from
seq N with prev_hash H". The anchor's signature must be valid, a signed
checkpoint at seq N - 1 must name H, and the chain is walked from seq N
expecting prev_hash H. An archived prefix (what truncation exported) is checked
against the anchor that replaced it with ``--continued-by ANCHOR.json`` (the
anchor event's payload, e.g. from ``GET /api/v1/audit?type=audit.anchor``).

This file deliberately duplicates the hashing rules of ``audit/writer.py`` and
``audit/checkpoints.py`` so it can be copied alone; the test suite checks that
the two agree.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import hashlib
import json
import sys
from dataclasses import dataclass, field

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

EXPORT_FORMAT = "autoplane-audit-export/1"
GENESIS_HASH = "0" * 64
HASHED_FIELDS = (
    "chain", "seq", "timestamp", "trace_id", "stage", "type", "summary",
    "outcome", "workspace_id", "refs", "actor", "payload", "prev_hash",
)  # fmt: skip
CHECKPOINT_KIND = "autoplane.audit.checkpoint.v1"
ANCHOR_TYPE = "audit.anchor"
ANCHOR_KIND = "autoplane.audit.anchor.v1"


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_hash(event: dict) -> str:
    """The same value as ``audit.writer.event_hash`` (``timestamp`` already an ISO string)."""
    return hashlib.sha256(canonical_json({name: event[name] for name in HASHED_FIELDS}).encode()).hexdigest()


def checkpoint_bytes(cp: dict) -> bytes:
    statement = {
        "chain": cp["chain"],
        "created_at": cp["created_at"],
        "head_hash": cp["head_hash"],
        "kind": CHECKPOINT_KIND,
        "seq": int(cp["seq"]),
    }
    return canonical_json(statement).encode()


def anchor_bytes(statement: dict) -> bytes:
    signed = {name: statement.get(name) for name in ("chain", "created_at", "prev_hash", "seq")}
    signed["kind"] = ANCHOR_KIND
    return canonical_json(signed).encode()


def key_id_for(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Broken(Exception):
    """The first broken link; its message is what gets printed."""


@dataclass
class _Chain:
    checkpoints: dict[int, list[dict]] = field(default_factory=dict)  # seq -> checkpoints at that seq
    next_seq: int = 1
    prev_hash: str = GENESIS_HASH
    anchor: dict | None = None  # the newest anchor event seen


@dataclass
class Report:
    events: int = 0
    checkpoints: int = 0
    chains: int = 0
    ends: dict[str, tuple[int, str]] = field(default_factory=dict)  # chain -> (last seq, last hash)
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)  # the keys signatures were checked with


def _lines(path: str):
    with open(path, encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as exc:
                raise Broken(f"line {number} is not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise Broken(f"line {number} is not an export record")
            yield number, record


def _keys_from_header(header: dict) -> dict[str, Ed25519PublicKey]:
    keys = {}
    for entry in header.get("public_keys", []):
        try:
            key = Ed25519PublicKey.from_public_bytes(_b64url_decode(entry["public_key"]))
        except (KeyError, ValueError, binascii.Error):
            raise Broken(f"header lists an unusable public key {entry.get('key_id')!r}") from None
        if key_id_for(key) != entry.get("key_id"):
            raise Broken(f"header key {entry.get('key_id')!r} does not match its public key")
        keys[key_id_for(key)] = key
    return keys


def _load_trusted(paths: list[str]) -> dict[str, Ed25519PublicKey]:
    keys = {}
    for path in paths:
        with open(path, "rb") as fh:
            key = serialization.load_pem_public_key(fh.read())
        if not isinstance(key, Ed25519PublicKey):
            raise SystemExit(f"{path} is not an Ed25519 public key")
        keys[key_id_for(key)] = key
    return keys


def verify_export(path: str, trusted: dict[str, Ed25519PublicKey] | None = None) -> Report:
    """Verify the export at ``path``; raise :class:`Broken` at the first problem."""
    report = Report()
    chains: dict[str, _Chain] = {}
    keys: dict[str, Ed25519PublicKey] | None = trusted

    # Pass 1: header and checkpoints (signatures checked here).
    seen_header = False
    for number, record in _lines(path):
        if record["kind"] == "header":
            if record.get("format") != EXPORT_FORMAT:
                raise Broken(f"line {number}: unsupported export format {record.get('format')!r}")
            if tuple(record.get("hashed_fields", HASHED_FIELDS)) != HASHED_FIELDS:
                raise Broken(f"line {number}: the export hashes other fields than this verifier knows")
            seen_header = True
            if keys is None:
                keys = _keys_from_header(record)
        elif record["kind"] == "checkpoint":
            if keys is None:
                raise Broken(f"line {number}: checkpoint before the header")
            key = keys.get(record.get("key_id"))
            try:
                if key is None:
                    raise InvalidSignature
                key.verify(_b64url_decode(record["signature"]), checkpoint_bytes(record))
            except (InvalidSignature, KeyError, ValueError, binascii.Error):
                raise Broken(
                    f"chain {record.get('chain')}: checkpoint #{record.get('id')} (line {number}) has an invalid "
                    f"signature or an untrusted key {record.get('key_id')!r}"
                ) from None
            chain = chains.setdefault(record["chain"], _Chain())
            chain.checkpoints.setdefault(int(record["seq"]), []).append(record)
        elif record["kind"] == "event" and record.get("type") == ANCHOR_TYPE:
            chain = chains.setdefault(record.get("chain"), _Chain())
            if chain.anchor is None or record.get("seq", 0) > chain.anchor.get("seq", 0):
                chain.anchor = {**record, "line": number}
    if not seen_header:
        raise Broken("no header line: not an autoplane audit export")
    for name, chain in chains.items():
        if chain.anchor is not None:
            _start_at_anchor(name, chain, chain.anchor, keys or {})

    # Pass 2: events, in seq order per chain.
    for number, record in _lines(path):
        if record["kind"] != "event":
            continue
        try:
            name, seq, stored = record["chain"], record["seq"], record["hash"]
            computed = event_hash(record)
        except (KeyError, TypeError):
            raise Broken(f"line {number}: event record lacks hashed fields") from None
        where = f"chain {name}, event id {record.get('id')} (seq {seq}, line {number})"
        chain = chains.setdefault(name, _Chain())
        if chain.anchor is not None and isinstance(seq, int) and seq < chain.anchor["payload"]["seq"]:
            continue  # below the anchor: not part of the chain any more
        if seq != chain.next_seq:
            raise Broken(f"{where}: seq gap: expected seq {chain.next_seq}, found {seq}")
        if computed != stored:
            raise Broken(f"{where}: content does not match its hash (the event was altered)")
        if record["prev_hash"] != chain.prev_hash:
            raise Broken(f"{where}: prev_hash does not match the previous event's hash")
        for cp in chain.checkpoints.pop(seq, []):
            if cp["head_hash"] != stored:
                raise Broken(f"{where}: hash differs from the one signed in checkpoint #{cp.get('id')}")
            report.checkpoints += 1
        chain.next_seq, chain.prev_hash = seq + 1, stored
        report.events += 1

    for name, chain in sorted(chains.items()):
        if chain.checkpoints:
            cp = chain.checkpoints[max(chain.checkpoints)][-1]
            raise Broken(
                f"chain {name}: chain no longer reaches checkpoint #{cp.get('id')}: it was signed at seq "
                f"{cp['seq']} but the chain ends at seq {chain.next_seq - 1} (tail truncated)"
            )
        report.ends[name] = (chain.next_seq - 1, chain.prev_hash)
    report.chains = len(chains)
    report.keys = keys or {}
    return report


def _start_at_anchor(name: str, chain: _Chain, anchor: dict, keys: dict[str, Ed25519PublicKey]) -> None:
    where = f"chain {name}: truncation anchor (event id {anchor.get('id')}, line {anchor['line']})"
    payload = anchor.get("payload")
    if not isinstance(payload, dict) or payload.get("kind") != ANCHOR_KIND or payload.get("chain") != name:
        raise Broken(f"{where} is malformed")
    seq, prev_hash = payload.get("seq"), payload.get("prev_hash")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2 or not isinstance(prev_hash, str):
        raise Broken(f"{where} is malformed")
    key = keys.get(str(payload.get("key_id")))
    try:
        if key is None:
            raise InvalidSignature
        key.verify(_b64url_decode(str(payload.get("signature", ""))), anchor_bytes(payload))
    except (InvalidSignature, ValueError, binascii.Error):
        raise Broken(f"{where} has an invalid signature or an untrusted key (forged or edited)") from None
    if not any(cp["head_hash"] == prev_hash for cp in chain.checkpoints.get(seq - 1, [])):
        raise Broken(f"{where} is not backed by a signed checkpoint at seq {seq - 1} with its prev_hash")
    chain.next_seq, chain.prev_hash = seq, prev_hash
    # The checkpoints below the anchor were checked for their signatures; their events are archived elsewhere.
    for below in [s for s in chain.checkpoints if s < seq]:
        del chain.checkpoints[below]


def verify_continued_by(report: Report, anchor: dict) -> None:
    """The verified export ``report`` is the prefix that ``anchor`` (an anchor event's payload) replaced."""
    if not isinstance(anchor, dict):
        raise Broken("the anchor is not a JSON object")
    name = str(anchor.get("chain"))
    key = report.keys.get(str(anchor.get("key_id")))
    try:
        if key is None or anchor.get("kind") != ANCHOR_KIND:
            raise InvalidSignature
        key.verify(_b64url_decode(str(anchor.get("signature", ""))), anchor_bytes(anchor))
    except (InvalidSignature, ValueError, binascii.Error):
        raise Broken(f"chain {name}: the anchor has an invalid signature or an untrusted key") from None
    end = report.ends.get(name)
    seq = anchor.get("seq")
    if not isinstance(seq, int) or end != (seq - 1, anchor.get("prev_hash")):
        raise Broken(
            f"chain {name}: the export ends at {end} but the anchor continues from seq {anchor.get('seq')} "
            f"with prev_hash {anchor.get('prev_hash')}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Verify an autoplane audit export (JSON Lines) offline.")
    parser.add_argument("export", help="file written by `manage.py audit_export`")
    parser.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="PEM",
        help="trust only this public key (repeatable); default: the keys in the export's header",
    )
    parser.add_argument(
        "--continued-by",
        metavar="ANCHOR_JSON",
        help="the export is an archived prefix: check it ends where this anchor (its payload, JSON) continues",
    )
    args = parser.parse_args(argv)
    trusted = _load_trusted(args.trusted_key) if args.trusted_key else None
    try:
        report = verify_export(args.export, trusted)
        if args.continued_by:
            with open(args.continued_by, encoding="utf-8") as fh:
                anchor = json.load(fh)
            verify_continued_by(report, anchor.get("payload", anchor))
    except Broken as exc:
        sys.stdout.write(f"audit export BROKEN: {exc}\n")
        return 1
    except OSError as exc:
        sys.stderr.write(f"cannot read {args.export}: {exc}\n")
        return 2
    source = "trusted keys" if trusted else "the export's header keys"
    sys.stdout.write(
        f"audit export OK: {report.events} events and {report.checkpoints} checkpoints verified "
        f"in {report.chains} chain(s) (signatures checked against {source})\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
