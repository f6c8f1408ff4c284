"""Walking the ledger: every hash recomputed, every link and checkpoint checked.

A chain is intact when, in seq order from 1 without gaps, each event's stored
hash equals :func:`audit.writer.event_hash` of its fields, each ``prev_hash``
equals the previous event's hash (the genesis hash for seq 1), the head row
agrees with the walk, and every checkpoint of the chain carries a valid
signature and names an event that still exists with exactly the signed hash.
The last check is what reveals a truncated tail, even when whoever deleted the
rows also rewound the head row.

Verification covers the *sequenced* prefix of each chain (see
:mod:`audit.sequencer`); entries still waiting for the sequencer are counted
(``waiting``) and each is checked against the entry hash sealed at append, so
an entry altered while it waits is reported too.

A truncated chain (docs/audit.md, "Retention") starts at its newest truncation
anchor instead: the anchor must carry a valid signature and be backed by a
signed checkpoint at seq N - 1 with hash H, and the walk starts at seq N
expecting prev_hash H. Checkpoints below N keep having their signatures checked.

Verification streams the events (``.iterator()``) and runs beside writers and
the sequencer: the head and checkpoints are read first, so anything sequenced
during the walk is either checked or left for the next run, never reported as broken.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from .checkpoints import anchor_signature_valid, checkpoint_signature_valid, newest_anchor
from .models import AuditChainHead, AuditCheckpoint, AuditEvent
from .writer import CONTENT_FIELDS, GENESIS_HASH, HASHED_FIELDS, entry_hash, event_hash

_CHUNK = 2000


@dataclass(frozen=True)
class BrokenLink:
    chain: str
    reason: str
    event_id: int | None = None
    seq: int | None = None
    checkpoint_id: int | None = None

    def __str__(self) -> str:
        where = f"chain {self.chain}"
        if self.event_id is not None:
            where += f", event id {self.event_id} (seq {self.seq})"
        elif self.seq is not None:
            where += f", seq {self.seq}"
        return f"{where}: {self.reason}"


@dataclass
class VerifyResult:
    chains: list[str] = field(default_factory=list)
    events: int = 0
    checkpoints: int = 0
    waiting: int = 0
    broken: BrokenLink | None = None

    @property
    def ok(self) -> bool:
        return self.broken is None

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "chains": len(self.chains),
            "events": self.events,
            "checkpoints": self.checkpoints,
            "waiting": self.waiting,
            "broken": asdict(self.broken) if self.broken else None,
        }

    def summary(self) -> str:
        """One line, as ``manage.py audit_verify`` and the admin's "Verify the ledger" say it."""
        if not self.ok:
            return f"audit ledger BROKEN: {self.broken}"
        return (
            f"audit ledger OK: {self.events} events and {self.checkpoints} checkpoints verified "
            f"in {len(self.chains)} chain(s); {self.waiting} entries waiting for the sequencer "
            "(checked against their entry hashes)"
        )

    def merge(self, other: VerifyResult) -> None:
        self.chains.extend(other.chains)
        self.events += other.events
        self.checkpoints += other.checkpoints
        self.waiting += other.waiting
        self.broken = self.broken or other.broken


def verify_chain(chain: str, *, since_checkpoint: bool = False) -> VerifyResult:
    """Verify one chain; ``result.broken`` names the first broken link.

    ``since_checkpoint``: walk only from the chain's newest checkpoint on (every
    checkpoint's signature is still checked, and the checkpointed event must still
    carry the signed hash). What lies below that checkpoint is taken as the last full
    verification left it, so a nightly run costs the day's events; run a full one
    regularly too, since only it recomputes the older rows.
    """
    result = VerifyResult(chains=[chain])

    def broken(reason: str, **where) -> VerifyResult:
        result.broken = BrokenLink(chain=chain, reason=reason, **where)
        return result

    head = AuditChainHead.objects.filter(chain=chain).values_list("seq", "head_hash").first()
    checkpoints = list(AuditCheckpoint.objects.filter(chain=chain).order_by("seq", "id"))
    for cp in checkpoints:
        if not checkpoint_signature_valid(cp):
            return broken(
                f"checkpoint #{cp.id} has an invalid signature (key {cp.key_id or '?'})",
                seq=cp.seq,
                checkpoint_id=cp.id,
            )

    expected_seq, prev_hash, last_id = 1, GENESIS_HASH, None
    anchor = newest_anchor(chain)
    if anchor is not None:
        if not anchor_signature_valid(anchor.payload, chain):
            return broken(
                "truncation anchor has an invalid signature or statement (forged or edited)",
                event_id=anchor.id,
                seq=anchor.seq,
            )
        expected_seq, prev_hash = anchor.payload["seq"], anchor.payload["prev_hash"]
        if anchor.seq < expected_seq or not any(
            cp.seq == expected_seq - 1 and cp.head_hash == prev_hash for cp in checkpoints
        ):
            return broken(
                f"truncation anchor (from seq {expected_seq}) is not backed by a signed checkpoint at "
                f"seq {expected_seq - 1} with its prev_hash",
                event_id=anchor.id,
                seq=anchor.seq,
            )
    rows = AuditEvent.objects.filter(chain=chain, seq__gte=expected_seq)
    if since_checkpoint and checkpoints and checkpoints[-1].seq >= expected_seq:
        rows = rows.filter(seq__gte=checkpoints[-1].seq)
        # None: the first row's prev_hash is vouched for by the checkpoint's signed hash of that row.
        expected_seq, prev_hash = checkpoints[-1].seq, None
    # Checkpoints below the start (truncated away) were checked for their signatures only.
    pending = next((i for i, cp in enumerate(checkpoints) if cp.seq >= expected_seq), len(checkpoints))
    rows = (
        rows.order_by("seq")
        .values_list("id", "hash", "entry_hash", *HASHED_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    head_seen = head is None or head[0] == 0
    for row in rows:
        event_id, stored_hash, sealed = row[0], row[1], row[2]
        fields = dict(zip(HASHED_FIELDS, row[3:], strict=True))
        seq = fields["seq"]
        if seq != expected_seq:
            return broken(
                f"seq gap: expected seq {expected_seq}, found {seq} (events missing before it)",
                event_id=event_id,
                seq=seq,
            )
        if event_hash(fields) != stored_hash:
            return broken("content does not match its hash (the row was altered)", event_id=event_id, seq=seq)
        if sealed and entry_hash(fields) != sealed:
            return broken(
                "content does not match its entry hash (the row was altered)", event_id=event_id, seq=seq
            )
        if prev_hash is not None and fields["prev_hash"] != prev_hash:
            return broken("prev_hash does not match the previous event's hash", event_id=event_id, seq=seq)
        while pending < len(checkpoints) and checkpoints[pending].seq == seq:
            if checkpoints[pending].head_hash != stored_hash:
                cp = checkpoints[pending]
                return broken(
                    f"hash differs from the one signed in checkpoint #{cp.id}",
                    event_id=event_id,
                    seq=seq,
                    checkpoint_id=cp.id,
                )
            result.checkpoints += 1
            pending += 1
        if head is not None and seq == head[0]:
            if stored_hash != head[1]:
                return broken(
                    "chain head row names a different hash for this seq", event_id=event_id, seq=seq
                )
            head_seen = True
        result.events += 1
        expected_seq, prev_hash, last_id = seq + 1, stored_hash, event_id

    last_seq = expected_seq - 1
    if pending < len(checkpoints):
        cp = checkpoints[-1]
        return broken(
            f"chain no longer reaches checkpoint #{cp.id}: it was signed at seq {cp.seq} "
            f"({cp.created_at.isoformat()}) but the chain ends at seq {last_seq} (tail truncated)",
            seq=cp.seq,
            checkpoint_id=cp.id,
        )
    if not head_seen:
        return broken(
            f"chain head row says seq {head[0]} but the chain ends at seq {last_seq} (tail truncated)",
            event_id=last_id,
            seq=last_seq if last_id else None,
        )
    if head is None and last_id is not None:
        return broken("chain head row is missing", event_id=last_id, seq=last_seq)
    return _verify_waiting(chain, result, broken)


def _verify_waiting(chain: str, result: VerifyResult, broken) -> VerifyResult:
    """Entries not yet sequenced: each must still match the entry hash sealed when it was appended."""
    waiting = (
        AuditEvent.objects.filter(chain=chain, seq__isnull=True)
        .order_by("id")
        .values_list("id", "entry_hash", *CONTENT_FIELDS)
        .iterator(chunk_size=_CHUNK)
    )
    for event_id, sealed, *content in waiting:
        if not sealed or entry_hash(dict(zip(CONTENT_FIELDS, content, strict=True))) != sealed:
            return broken(
                "waiting entry does not match its entry hash (the row was altered)", event_id=event_id
            )
        result.waiting += 1
    return result


def all_chains() -> list[str]:
    chains: set[str] = set(AuditChainHead.objects.values_list("chain", flat=True))
    chains.update(AuditCheckpoint.objects.order_by().values_list("chain", flat=True).distinct())
    chains.update(AuditEvent.objects.order_by().values_list("chain", flat=True).distinct())
    return sorted(chains)


def verify_all(chains: Iterable[str] | None = None, *, since_checkpoint: bool = False) -> VerifyResult:
    """Verify ``chains`` (default: every chain in the ledger), stopping at the first broken one."""
    result = VerifyResult()
    for chain in all_chains() if chains is None else sorted(set(chains)):
        result.merge(verify_chain(chain, since_checkpoint=since_checkpoint))
        if not result.ok:
            break
    return result
