"""Exporting the ledger as JSON Lines that ``audit/offline_verify.py`` checks without Django.

Line 1 is a header (format, hashed fields, genesis hash, the public keys).
Then, per chain, its checkpoints followed by its events in seq order::

    {"kind": "header", "format": "autoplane-audit-export/1", "public_keys": [...], ...}
    {"kind": "checkpoint", "id": 7, "chain": "ws-1", "seq": 120, "head_hash": "...",
     "created_at": "...", "key_id": "...", "signature": "..."}
    {"kind": "event", "id": 1, "hash": "...", <every hashed field; timestamp as ISO 8601>}

Each line is canonical JSON (sorted keys, no whitespace, UTF-8).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TextIO

from django.utils import timezone

from . import signing
from .checkpoints import CHECKPOINT_KIND
from .models import AuditCheckpoint, AuditEvent
from .verify import all_chains
from .writer import GENESIS_HASH, HASHED_FIELDS, canonical_json, format_timestamp

EXPORT_FORMAT = "autoplane-audit-export/1"


@dataclass
class ExportCounts:
    chains: int = 0
    events: int = 0
    checkpoints: int = 0


def export_jsonl(out: TextIO, chains: Iterable[str] | None = None) -> ExportCounts:
    chain_list = all_chains() if chains is None else sorted(set(chains))
    header = {
        "kind": "header",
        "format": EXPORT_FORMAT,
        "exported_at": format_timestamp(timezone.now()),
        "chains": chain_list,
        "hash_algorithm": "sha256",
        "hashed_fields": list(HASHED_FIELDS),
        "genesis_hash": GENESIS_HASH,
        "checkpoint_kind": CHECKPOINT_KIND,
        "public_keys": [
            {
                "key_id": k["key_id"],
                "algorithm": k["algorithm"],
                "public_key": k["public_key"],
                "current": k["current"],
            }
            for k in signing.public_keys()
        ],
    }
    out.write(canonical_json(header) + "\n")
    counts = ExportCounts(chains=len(chain_list))
    for chain in chain_list:
        # Checkpoints first: every event they name was committed before the events query below runs.
        for cp in AuditCheckpoint.objects.filter(chain=chain).order_by("seq", "id").iterator():
            line = {
                "kind": "checkpoint",
                "id": cp.id,
                "chain": cp.chain,
                "seq": cp.seq,
                "head_hash": cp.head_hash,
                "created_at": format_timestamp(cp.created_at),
                "key_id": cp.key_id,
                "signature": cp.signature,
            }
            out.write(canonical_json(line) + "\n")
            counts.checkpoints += 1
        rows = (
            AuditEvent.objects.filter(chain=chain, seq__isnull=False)
            .order_by("seq")
            .values_list("id", "hash", *HASHED_FIELDS)
        )
        for row in rows.iterator(chunk_size=2000):
            line = {
                "kind": "event",
                "id": row[0],
                "hash": row[1],
                **dict(zip(HASHED_FIELDS, row[2:], strict=True)),
            }
            line["timestamp"] = format_timestamp(line["timestamp"])
            out.write(canonical_json(line) + "\n")
            counts.events += 1
    return counts
