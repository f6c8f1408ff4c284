"""Truncating the ledger: a signed anchor lets a chain start after seq 1 (docs/audit.md, "Retention").

A truncation anchor is an ordinary event of the chain (type ``audit.anchor``,
appended by :mod:`audit.writer` and chained by the sequencer like any other),
whose payload is a signed statement "chain C continues from seq N with prev_hash H".
The signed bytes are the canonical JSON (keys sorted, no whitespace, UTF-8) of::

    {"chain": C, "created_at": "<ISO 8601>", "kind": "autoplane.audit.anchor.v1",
     "prev_hash": H, "seq": N}

signed with the checkpoints' Ed25519 key (:mod:`audit.signing`); ``kind`` keeps
the signature from being replayed as a checkpoint. ``audit/offline_verify.py``
rebuilds the same bytes.

:func:`truncate_chain` cuts a chain only below a signed checkpoint older than
the retention window (H is that checkpoint's head hash, N its seq + 1), and only
past the chain's previous anchor. In order: the prefix (events below N and the
checkpoints among them) is exported in ``audit_export``'s format and the file
verified offline against H; then the anchor is appended and sequenced; then the
rows below N are deleted in batches, which is the one DELETE the database guard
allows (migration 0008). A crash anywhere leaves either nothing done or an
anchor whose prefix is already exported: the next pass deletes what is left.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from . import offline_verify, signing, writer
from .checkpoints import (
    ANCHOR_KIND,
    ANCHOR_TYPE,
    anchor_bytes,
    anchor_signature_valid,
    checkpoint_signature_valid,
    newest_anchor,
)
from .export import export_jsonl
from .models import AuditCheckpoint, AuditEvent
from .sequencer import sequence_pending

log = logging.getLogger(__name__)


def _workspace_of(chain: str) -> int | None:
    return int(chain.removeprefix("ws-")) if chain.startswith("ws-") else None


def export_dir() -> Path:
    path = Path(settings.AUTOPLANE_AUDIT_EXPORT_DIR or settings.DATA_DIR / "audit-exports")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def verify_prefix(path: str | Path, anchor_payload: dict) -> offline_verify.Report:
    """Verify an exported prefix and that it ends exactly where ``anchor_payload`` says the chain continues.

    Raises :class:`audit.offline_verify.Broken` otherwise.
    """
    report = offline_verify.verify_export(str(path))
    offline_verify.verify_continued_by(report, anchor_payload)
    return report


@dataclass
class Truncation:
    chain: str
    from_seq: int = 0  # the anchor's N (0: nothing to cut)
    exported: int = 0
    deleted: int = 0
    file: str = ""


def _candidate(chain: str, cutoff: datetime, floor: int) -> AuditCheckpoint | None:
    """The newest validly signed checkpoint older than ``cutoff`` that moves the chain's start past ``floor``."""
    checkpoints = AuditCheckpoint.objects.filter(chain=chain, created_at__lt=cutoff, seq__gte=floor)
    for cp in checkpoints.order_by("-seq", "-id")[:20]:
        if (
            checkpoint_signature_valid(cp)
            and AuditEvent.objects.filter(chain=chain, seq=cp.seq, hash=cp.head_hash).exists()
        ):
            return cp
    return None


def _delete_below(chain: str, from_seq: int, batch: int) -> int:
    deleted = 0
    while True:
        with transaction.atomic():
            ids = list(
                AuditEvent.objects.filter(chain=chain, seq__lt=from_seq)
                .order_by("seq")
                .values_list("id", flat=True)[:batch]
            )
            if not ids:
                return deleted
            deleted += AuditEvent.objects.filter(chain=chain, seq__lt=from_seq, id__in=ids).delete()[0]


def truncate_chain(chain: str, *, days: int, now: datetime | None = None, batch: int = 5000) -> Truncation:
    """Cut ``chain`` below its newest signed checkpoint older than ``days`` days (see the module docstring)."""
    result = Truncation(chain=chain)
    anchor = newest_anchor(chain)
    if anchor is not None and anchor_signature_valid(anchor.payload, chain):
        # Finish a pass that was interrupted after its anchor, before anything new.
        result.from_seq = anchor.payload["seq"]
        result.deleted = _delete_below(chain, result.from_seq, batch)
    # A new cut must take the previous anchor with it, so every prefix file holds the anchor it starts from.
    floor = (anchor.seq or 1) if anchor is not None else 1
    cutoff = (now or timezone.now()) - timedelta(days=days)
    cp = _candidate(chain, cutoff, floor)
    if cp is None:
        return result
    from_seq, prev_hash = cp.seq + 1, cp.head_hash
    stamp = timezone.now()
    path = export_dir() / f"audit-{chain}-{from_seq - 1:012d}-{stamp:%Y%m%dT%H%M%S}.jsonl"
    statement = {"chain": chain, "created_at": stamp.isoformat(timespec="microseconds"), "kind": ANCHOR_KIND,
                 "prev_hash": prev_hash, "seq": from_seq}  # fmt: skip
    key_id, signature = signing.sign(anchor_bytes(statement))
    statement.update(key_id=key_id, signature=signature)
    with open(path, "w", encoding="utf-8", newline="\n") as fh:
        counts = export_jsonl(fh, [chain], below_seq=from_seq)
    verify_prefix(path, statement)  # before anything is written or deleted
    writer.append(
        trace_id=uuid.uuid4().hex,
        type=ANCHOR_TYPE,
        summary=f"chain {chain} continues from seq {from_seq}; the prefix is archived in {path.name}",
        workspace_id=_workspace_of(chain),
        stage="retention",
        payload={**statement, "file": path.name, "events": counts.events, "retention_days": days},
    )
    sequence_pending(chains=[chain])
    anchored = newest_anchor(chain)
    if anchored is None or anchored.payload.get("seq") != from_seq:
        raise RuntimeError(f"chain {chain}: the truncation anchor was not sequenced; nothing deleted")
    result.from_seq, result.exported, result.file = from_seq, counts.events, str(path)
    result.deleted += _delete_below(chain, from_seq, batch)
    log.info(
        "audit chain %s truncated below seq %s (%s rows, exported to %s)",
        chain,
        from_seq,
        result.deleted,
        path,
    )
    return result


def truncate_all(*, days: int | None = None, now: datetime | None = None) -> list[Truncation]:
    """Every chain with a checkpoint older than the window; nothing when retention is off (0/unset)."""
    days = settings.AUTOPLANE_AUDIT_RETENTION_DAYS if days is None else days
    if not days or days <= 0:
        return []
    cutoff = (now or timezone.now()) - timedelta(days=days)
    chains = sorted(
        AuditCheckpoint.objects.filter(created_at__lt=cutoff)
        .order_by()
        .values_list("chain", flat=True)
        .distinct()
    )
    return [truncate_chain(chain, days=days, now=now) for chain in chains]
