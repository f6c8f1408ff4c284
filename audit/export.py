"""Exporting the ledger as JSON Lines that ``audit/offline_verify.py`` checks without Django.

Line 1 is a header (format, hashed fields, genesis hash, the public keys).
Then, per chain, its checkpoints followed by its events in seq order::

    {"kind": "header", "format": "autoplane-audit-export/1", "public_keys": [...], ...}
    {"kind": "checkpoint", "id": 7, "chain": "ws-1", "seq": 120, "head_hash": "...",
     "created_at": "...", "key_id": "...", "signature": "..."}
    {"kind": "event", "id": 1, "hash": "...", <every hashed field; timestamp as ISO 8601>}

Each line is canonical JSON (sorted keys, no whitespace, UTF-8).

A truncated chain starts at its newest truncation anchor (an event of type
``audit.anchor``, exported like any other): its events begin at the anchor's
seq, and the checkpoints below it are kept for their signatures. ``below_seq``
exports only a chain's prefix below that seq (what truncation archives).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.utils import timezone

from . import signing
from .checkpoints import ANCHOR_KIND, ANCHOR_TYPE, CHECKPOINT_KIND, newest_anchor
from .models import AuditCheckpoint, AuditEvent
from .verify import all_chains
from .writer import GENESIS_HASH, HASHED_FIELDS, canonical_json, format_timestamp

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

EXPORT_FORMAT = "autoplane-audit-export/1"


@dataclass
class ExportCounts:
    chains: int = 0
    events: int = 0
    checkpoints: int = 0


def chain_start(chain: str) -> int:
    """The seq a chain starts at: its newest anchor's, or 1 (the anchor's signature is the verifier's business)."""
    anchor = newest_anchor(chain)
    seq = anchor.payload.get("seq") if anchor is not None and isinstance(anchor.payload, dict) else None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) and seq > 1 else 1


def export_jsonl(
    out: SupportsWrite[str], chains: Iterable[str] | None = None, *, below_seq: int | None = None
) -> ExportCounts:
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
        "anchor_type": ANCHOR_TYPE,
        "anchor_kind": ANCHOR_KIND,
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
        checkpoints = AuditCheckpoint.objects.filter(chain=chain)
        if below_seq is not None:
            checkpoints = checkpoints.filter(seq__lt=below_seq)
        for cp in checkpoints.order_by("seq", "id").iterator():
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
        events = AuditEvent.objects.filter(chain=chain, seq__gte=chain_start(chain))
        if below_seq is not None:
            events = events.filter(seq__lt=below_seq)
        rows = events.order_by("seq").values_list("id", "hash", *HASHED_FIELDS)
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
