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


@dataclass
class Report:
    events: int = 0
    checkpoints: int = 0
    chains: int = 0


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
    if not seen_header:
        raise Broken("no header line: not an autoplane audit export")

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
    report.chains = len(chains)
    return report


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
    args = parser.parse_args(argv)
    trusted = _load_trusted(args.trusted_key) if args.trusted_key else None
    try:
        report = verify_export(args.export, trusted)
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
