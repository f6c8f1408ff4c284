"""Signed checkpoints: the one thing a hash chain cannot show by itself is a cut-off tail.

A checkpoint states "chain C had ``seq`` events ending in ``head_hash`` at
``created_at``", signed with the platform's Ed25519 key. Verification then
requires the event at ``seq`` to exist with exactly that hash, so deleting the
newest rows (and rewinding the head row to match) is detected.

The signed bytes are the canonical JSON (keys sorted, no whitespace, UTF-8) of::

    {"chain": C, "created_at": "<ISO 8601, microseconds, +00:00>",
     "head_hash": "<64 hex>", "kind": "autoplane.audit.checkpoint.v1", "seq": N}

``kind`` separates these signatures from anything else the same key signs
(approval tokens). ``audit/offline_verify.py`` rebuilds the same bytes.
"""

from __future__ import annotations

import json
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from . import signing
from .models import AuditChainHead, AuditCheckpoint, AuditEvent

CHECKPOINT_KIND = "autoplane.audit.checkpoint.v1"
# Truncation anchors (audit.anchors): events of this type carry a signed statement of this kind.
ANCHOR_TYPE = "audit.anchor"
ANCHOR_KIND = "autoplane.audit.anchor.v1"
_ANCHOR_SIGNED = ("chain", "created_at", "kind", "prev_hash", "seq")


def checkpoint_bytes(*, chain: str, seq: int, head_hash: str, created_at: datetime | str) -> bytes:
    if isinstance(created_at, datetime):
        created_at = created_at.isoformat(timespec="microseconds")
    statement = {
        "chain": chain,
        "created_at": created_at,
        "head_hash": head_hash,
        "kind": CHECKPOINT_KIND,
        "seq": int(seq),
    }
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def checkpoint_signature_valid(checkpoint: AuditCheckpoint) -> bool:
    data = checkpoint_bytes(
        chain=checkpoint.chain,
        seq=checkpoint.seq,
        head_hash=checkpoint.head_hash,
        created_at=checkpoint.created_at,
    )
    return signing.verify(checkpoint.key_id, data, checkpoint.signature)


def latest_checkpoint(chain: str) -> AuditCheckpoint | None:
    return AuditCheckpoint.objects.filter(chain=chain).order_by("-id").first()


@transaction.atomic
def checkpoint_write(chain: str | None = None) -> list[AuditCheckpoint]:
    """Sign the head of every chain that moved since its last checkpoint (or of ``chain`` only).

    A chain whose latest checkpoint was signed by a key that is no longer current
    is re-signed too, so a rotation never leaves a chain vouched for only by a
    retired key. Returns the checkpoints written.
    """
    heads = AuditChainHead.objects.filter(seq__gt=0).order_by("chain")
    if chain is not None:
        heads = heads.filter(chain=chain)
    key_id = signing.current_key_id()
    written = []
    for head in heads:
        last = latest_checkpoint(head.chain)
        if last and (last.seq, last.head_hash, last.key_id) == (head.seq, head.head_hash, key_id):
            continue
        created_at = timezone.now()
        data = checkpoint_bytes(
            chain=head.chain, seq=head.seq, head_hash=head.head_hash, created_at=created_at
        )
        signed_by, signature = signing.sign(data)
        written.append(
            AuditCheckpoint.objects.create(
                chain=head.chain,
                seq=head.seq,
                head_hash=head.head_hash,
                created_at=created_at,
                key_id=signed_by,
                signature=signature,
            )
        )
    return written


def anchor_bytes(statement: dict) -> bytes:
    """The signed bytes of a truncation anchor ("chain C continues from seq N with prev_hash H")."""
    signed = {name: statement.get(name) for name in _ANCHOR_SIGNED}
    signed["kind"] = ANCHOR_KIND
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def anchor_signature_valid(payload: object, chain: str) -> bool:
    """An anchor event's payload is a well-formed statement about ``chain`` signed by a known key."""
    if not isinstance(payload, dict) or payload.get("kind") != ANCHOR_KIND or payload.get("chain") != chain:
        return False
    seq = payload.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 2:
        return False
    if not isinstance(payload.get("prev_hash"), str) or not isinstance(payload.get("created_at"), str):
        return False
    return signing.verify(
        str(payload.get("key_id", "")), anchor_bytes(payload), str(payload.get("signature", ""))
    )


def newest_anchor(chain: str) -> AuditEvent | None:
    """The chain's newest sequenced anchor event: where verification and export start the chain."""
    return (
        AuditEvent.objects.filter(chain=chain, type=ANCHOR_TYPE, seq__isnull=False).order_by("-seq").first()
    )
