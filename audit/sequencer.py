"""The sequencer: integrates unsequenced entries into their chains, in batches, in order.

Appends (:mod:`audit.writer`) are plain inserts with ``seq``, ``prev_hash`` and
``hash`` NULL. :func:`sequence_chain` takes the chain's head row lock (only
sequencers ever take it, so no writer waits for it), reads the oldest waiting
entries of the chain (by id), checks each one's sealed ``entry_hash`` against its
content, gives each the next ``seq`` and the previous hash, computes its
``hash`` (:func:`audit.writer.event_hash`, unchanged), fills the three fields in
one UPDATE and moves the head, all in one transaction.

Crash safety follows from that transaction: killed anywhere before its commit,
nothing of the batch is sequenced and the next pass does it again; after the
commit all of it is. The fill is guarded twice against a second sequencing: the
UPDATE matches only rows whose ``seq`` is still NULL (and fails the batch if one
does not match), and the database trigger refuses any change to a row whose
sequence fields are already set.

Entries are chained in the order the sequencer sees them committed (ascending
id among the visible waiting entries). Entries of one transaction are visible
together and keep their insertion order; a transaction that starts after
another commits is chained after it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Min
from django.utils import timezone

from .models import AuditChainHead, AuditEvent
from .writer import CONTENT_FIELDS, GENESIS_HASH, entry_hash, event_hash

log = logging.getLogger(__name__)


class EntryTampered(Exception):
    """A waiting entry's content no longer matches the entry hash sealed at append."""

    def __init__(self, chain: str, event_id: int):
        super().__init__(
            f"chain {chain}: waiting entry id {event_id} does not match its entry hash; not sequenced"
        )
        self.chain = chain
        self.event_id = event_id


def _lock_head(chain: str) -> AuditChainHead | None:
    """The chain's head row, locked for this transaction; None when another sequencer holds it."""
    if connection.vendor == "sqlite":
        # One writer at a time: a write first takes the database lock, so the read after it is current.
        with connection.cursor() as cursor:
            cursor.execute("UPDATE audit_auditchainhead SET seq = seq WHERE chain = %s", [chain])
        return AuditChainHead.objects.get_or_create(chain=chain)[0]
    AuditChainHead.objects.bulk_create([AuditChainHead(chain=chain)], ignore_conflicts=True)
    return AuditChainHead.objects.select_for_update(skip_locked=True).filter(chain=chain).first()


def _fill(rows: list[tuple[int, int, str, str]]) -> int:
    """Set (seq, prev_hash, hash) and clear entry_hash on still-unsequenced rows in one statement;
    returns the rows changed."""
    values = ", ".join(["(%s, %s, %s, %s)"] * len(rows))
    # The hashes go in as bytes (audit.models.HexHashField's storage).
    params = [
        v
        for event_id, seq, prev_hash, digest in rows
        for v in (event_id, seq, bytes.fromhex(prev_hash), bytes.fromhex(digest))
    ]
    # entry_hash is cleared: the seal was needed only while the entry waited (the hash covers
    # the same content from now on); the guard allows exactly this in the fill (migration 0012).
    if connection.vendor == "postgresql":
        fill = "SET seq = v.seq, prev_hash = v.prev_hash, hash = v.hash, entry_hash = '\\x'::bytea"
        sql = f"UPDATE audit_auditevent AS e {fill} FROM (VALUES {values}) AS v(id, seq, prev_hash, hash) "  # noqa: S608
        sql += "WHERE e.id = v.id::bigint AND e.seq IS NULL"
    else:
        # (SQLite names VALUES columns column1..4; and Python's sqlite3 counts rows only for a leading UPDATE.)
        renamed = "SELECT column1 AS id, column2 AS seq, column3 AS prev_hash, column4 AS hash FROM "
        renamed += f"(VALUES {values})"
        sql = "UPDATE audit_auditevent SET seq = v.seq, prev_hash = v.prev_hash, hash = v.hash, entry_hash = X'' "
        sql += f"FROM ({renamed}) AS v WHERE audit_auditevent.id = v.id AND audit_auditevent.seq IS NULL"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


# Rows per fill UPDATE. A fill writes every index entry of its rows anew (~13 µs a row in
# PostgreSQL): 500 rows in one statement were a 6.7 ms burst of a backend at normal priority,
# every pass, on the cores the runs use, and the fires it overlapped made the p99. In
# statements of 64 (~0.9 ms), between which the (niced) sequencer hashes the next rows, the
# backend yields the cores in short turns; the batch is still one transaction.
FILL_ROWS = 64


def _fill_checked(chain: str, rows: list[tuple[int, int, str, str]]) -> None:
    changed = _fill(rows)
    if changed != len(rows):  # another sequencer got there first: leave it all to it
        raise RuntimeError(f"chain {chain}: {len(rows) - changed} entries were sequenced concurrently")


def sequence_chain(chain: str, *, limit: int | None = None) -> int:
    """Sequence up to ``limit`` waiting entries of ``chain`` in one transaction; returns how many.

    Raises :class:`EntryTampered` (after sequencing the entries before it) when a
    waiting entry's content does not match its sealed entry hash: the chain stops
    there, visibly, until an operator investigates.
    """
    limit = limit or settings.AUTOPLANE_AUDIT_SEQUENCE_BATCH
    tampered: EntryTampered | None = None
    with transaction.atomic():
        head = _lock_head(chain)
        if head is None:
            return 0
        waiting = list(
            AuditEvent.objects.filter(chain=chain, seq__isnull=True)
            .order_by("id")
            .values_list("id", "entry_hash", *CONTENT_FIELDS)[:limit]
        )
        seq, prev_hash = head.seq, head.head_hash or GENESIS_HASH
        rows: list[tuple[int, int, str, str]] = []
        filled = 0
        last_timestamp: datetime | None = None
        for event_id, sealed, *content in waiting:
            fields = dict(zip(CONTENT_FIELDS, content, strict=True))
            if not sealed or entry_hash(fields) != sealed:
                tampered = EntryTampered(chain, event_id)
                break
            seq += 1
            fields.update(seq=seq, prev_hash=prev_hash)
            digest = event_hash(fields)
            rows.append((event_id, seq, prev_hash, digest))
            prev_hash, last_timestamp = digest, fields["timestamp"]
            if len(rows) - filled == FILL_ROWS:
                _fill_checked(chain, rows[filled:])
                filled = len(rows)
        if rows:
            if filled < len(rows):
                _fill_checked(chain, rows[filled:])
            AuditChainHead.objects.filter(pk=head.pk).update(
                seq=seq, head_hash=prev_hash, prev_hash=rows[-1][2], last_timestamp=last_timestamp
            )
    if tampered is not None:
        log.error("%s", tampered)
        raise tampered
    return len(rows)


def waiting_chains() -> list[str]:
    return sorted(
        AuditEvent.objects.filter(seq__isnull=True).order_by().values_list("chain", flat=True).distinct()
    )


def sequence_pending(*, chains: list[str] | None = None) -> int:
    """Sequence every waiting entry visible now, chain by chain; returns how many.

    A chain with a tampered waiting entry is logged and skipped (its other
    chains still move); ``audit_verify`` reports the entry.
    """
    total = 0
    for chain in waiting_chains() if chains is None else chains:
        while True:
            try:
                done = sequence_chain(chain)
            except EntryTampered:
                break
            total += done
            if done < settings.AUTOPLANE_AUDIT_SEQUENCE_BATCH:
                break
    return total


@dataclass(frozen=True)
class Backlog:
    entries: int
    oldest_age_seconds: float

    @property
    def within_bound(self) -> bool:
        return self.oldest_age_seconds <= settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS


def backlog() -> Backlog:
    """Entries waiting for the sequencer, and how long the oldest has waited (the merge delay now)."""
    waiting = AuditEvent.objects.filter(seq__isnull=True)
    oldest = waiting.aggregate(oldest=Min("timestamp"))["oldest"]
    age = 0.0 if oldest is None else max(0.0, (timezone.now() - oldest).total_seconds())
    return Backlog(entries=waiting.count() if oldest is not None else 0, oldest_age_seconds=round(age, 3))


def run_forever(*, interval: float, stop=lambda: False) -> None:
    """The sequencer loop: sequence what is waiting, then sleep ``interval``; errors are logged, never fatal."""
    while not stop():
        try:
            sequence_pending()
        except Exception:
            log.exception("audit sequencer pass failed; retrying")
            close_old_connections()
            connection.close()
        time.sleep(interval)
