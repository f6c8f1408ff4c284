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

Verification streams raw rows from a server-side cursor (no model instances) and
hashes them without building dicts (:class:`_ChainHasher`); a row whose digest
differs is recomputed through :mod:`audit.writer` before it is reported. Each
event is hashed once: its entry hash (the seal of its content at append) is
checked only above the chain's newest signed checkpoint, since below it the
event's ``hash``, which covers the same content, is vouched for by every later
link up to the signature. It runs beside writers and the sequencer: the head and
checkpoints are read first, so anything sequenced during the walk is either
checked or left for the next run, never reported as broken.
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import signal
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from json.encoder import encode_basestring as _encode_string  # type: ignore[attr-defined]
from typing import Any

from django.db import connection, connections, transaction

from .checkpoints import anchor_signature_valid, checkpoint_signature_valid, newest_anchor
from .models import AuditChainHead, AuditCheckpoint, AuditEvent
from .writer import CONTENT_FIELDS, GENESIS_HASH, HASHED_FIELDS, canonical_json, entry_hash, event_hash

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


def verify_chain(chain: str, *, since_checkpoint: bool = False, jobs: int = 1) -> VerifyResult:
    """Verify one chain; ``result.broken`` names the first broken link.

    ``since_checkpoint``: walk only from the chain's newest checkpoint on (its signature,
    and that of the checkpoint backing a truncation anchor, are checked, and the
    checkpointed event must still carry the signed hash). What lies below that checkpoint,
    rows and older checkpoints, is taken as the last full verification left it, so a
    nightly run costs the day's events; run a full one regularly too, since only it
    recomputes the older rows and re-checks every signature.

    ``jobs`` (PostgreSQL, outside a transaction): a long chain's walk is cut into that many
    ranges of seq, walked at once by as many processes; the result is the same.
    """
    result = VerifyResult(chains=[chain])

    def broken(reason: str, **where) -> VerifyResult:
        result.broken = BrokenLink(chain=chain, reason=reason, **where)
        return result

    head = AuditChainHead.objects.filter(chain=chain).values_list("seq", "head_hash").first()
    checkpoints = list(AuditCheckpoint.objects.filter(chain=chain).order_by("seq", "id"))

    def forged(checkpoints_to_check) -> VerifyResult | None:
        for cp in checkpoints_to_check:
            if not checkpoint_signature_valid(cp):
                return broken(
                    f"checkpoint #{cp.id} has an invalid signature (key {cp.key_id or '?'})",
                    seq=cp.seq,
                    checkpoint_id=cp.id,
                )
        return None

    # An incremental run checks the signatures it stands on (below); the others, like the
    # rows below its start, were checked by the last full run.
    if not since_checkpoint and (failed := forged(checkpoints)):
        return failed

    expected_seq, last_id = 1, None
    prev_hash: str | None = GENESIS_HASH
    anchor = newest_anchor(chain)
    if anchor is not None:
        if not anchor_signature_valid(anchor.payload, chain):
            return broken(
                "truncation anchor has an invalid signature or statement (forged or edited)",
                event_id=anchor.id,
                seq=anchor.seq,
            )
        expected_seq, prev_hash = anchor.payload["seq"], anchor.payload["prev_hash"]
        backing = [cp for cp in checkpoints if cp.seq == expected_seq - 1 and cp.head_hash == prev_hash]
        if anchor.seq < expected_seq or not backing:
            return broken(
                f"truncation anchor (from seq {expected_seq}) is not backed by a signed checkpoint at "
                f"seq {expected_seq - 1} with its prev_hash",
                event_id=anchor.id,
                seq=anchor.seq,
            )
        if since_checkpoint and (failed := forged(backing)):
            return failed
    if since_checkpoint and checkpoints and checkpoints[-1].seq >= expected_seq:
        # None: the first row's prev_hash is vouched for by the checkpoint's signed hash of that row.
        expected_seq, prev_hash = checkpoints[-1].seq, None
    if since_checkpoint and (failed := forged(cp for cp in checkpoints if cp.seq >= expected_seq)):
        return failed
    # Checkpoints below the start (truncated away) were checked for their signatures only.
    pending = next((i for i, cp in enumerate(checkpoints) if cp.seq >= expected_seq), len(checkpoints))
    signed_hashes = [_hex_bytes(cp.head_hash) for cp in checkpoints]
    head_hash = _hex_bytes(head[1]) if head is not None else None
    # Below the newest checkpoint an entry's seal adds nothing to its hash, which the signed
    # head vouches for through every later link; above it the seal is checked too.
    sealed_from = checkpoints[-1].seq + 1 if checkpoints else 0
    link = None if prev_hash is None else _hex_bytes(prev_hash)
    head_seen = head is None or head[0] == 0
    last_id = None
    hashes = _ChainHasher(chain)
    first_seq, last_seq = None, expected_seq - 1
    # The SQL walk returns only the rows that need a look; the checkpointed rows among the others
    # are read by seq (an index probe each), so checking them costs the checkpoints, not the rows.
    signed_rows: dict[int, tuple[int, bytes]] = {}

    def settle(upto: int) -> VerifyResult | None:
        """The checkpoints below ``upto`` whose rows the SQL walk passed without returning them."""
        nonlocal pending
        while (
            pending < len(checkpoints)
            and checkpoints[pending].seq < upto
            and checkpoints[pending].seq in signed_rows
        ):
            cp = checkpoints[pending]
            event_id, stored = signed_rows[cp.seq]
            if signed_hashes[pending] != stored:
                return broken(
                    f"hash differs from the one signed in checkpoint #{cp.id}",
                    event_id=event_id,
                    seq=cp.seq,
                    checkpoint_id=cp.id,
                )
            result.checkpoints += 1
            pending += 1
        return None

    if connection.vendor == "postgresql":
        signed_rows = _rows_at(chain, sorted({cp.seq for cp in checkpoints[pending:]}))
        head_seq = head[0] if head is not None else 0
        ranges = _ranges(expected_seq, head_seq, jobs if not connection.in_atomic_block else 1)
        if len(ranges) > 1:
            walk = _parallel_walk(chain, ranges, sealed_from, head_seq)
        else:
            walk = _sql_walk(chain, expected_seq, sealed_from, head_seq)
    else:
        walk = _python_walk(chain, expected_seq)
    with closing(walk) as rows:
        for event_id, seq, stored, prev, sealed, content, hash_ok, entry_ok, before in rows:
            if failed := settle(seq):
                return failed
            # ``before``: (seq, hash) of the row preceding this one in the walk, None for the first.
            want_seq, want_link = (expected_seq, link) if before is None else (before[0] + 1, before[1])
            if seq != want_seq:
                return broken(
                    f"seq gap: expected seq {want_seq}, found {seq} (events missing before it)",
                    event_id=event_id,
                    seq=seq,
                )
            if (
                not hash_ok
                and hashes.event(seq, prev, content) != stored
                and not _slow_check(event_id, "hash")
            ):
                return broken(
                    "content does not match its hash (the row was altered)", event_id=event_id, seq=seq
                )
            if (
                not entry_ok
                and sealed
                and seq >= sealed_from
                and hashes.entry(content) != sealed
                and not _slow_check(event_id, "entry_hash")
            ):
                return broken(
                    "content does not match its entry hash (the row was altered)", event_id=event_id, seq=seq
                )
            if want_link is not None and prev != want_link:
                return broken(
                    "prev_hash does not match the previous event's hash", event_id=event_id, seq=seq
                )
            while pending < len(checkpoints) and checkpoints[pending].seq == seq:
                if signed_hashes[pending] != stored:
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
                if stored != head_hash:
                    return broken(
                        "chain head row names a different hash for this seq", event_id=event_id, seq=seq
                    )
                head_seen = True
            if first_seq is None:
                first_seq = seq
            last_seq, last_id = seq, event_id
    # Every row between the first and the last was seen (a gap would have broken the walk).
    result.events += 0 if first_seq is None else last_seq - first_seq + 1
    if failed := settle(last_seq + 1):
        return failed

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


def _hex_bytes(value: str) -> bytes:
    """A hex digest as bytes; anything else (a forged or garbled value) as b"", which matches no digest."""
    try:
        return bytes.fromhex(value)
    except (TypeError, ValueError):
        return b""


_ROWS_SQL = (
    "SELECT id, seq, hash, prev_hash, entry_hash, {timestamp}, trace_id, stage, type, summary, outcome,"
    " workspace_id, refs, actor, payload FROM audit_auditevent WHERE chain = %s AND seq >= %s ORDER BY seq"
)
# PostgreSQL writes the timestamp as writer.format_timestamp does (cheaper than a datetime per row).
_PG_TIMESTAMP = """to_char(timestamp AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""


def _python_walk(chain: str, start: int) -> Iterator[tuple]:
    """Every sequenced row of the chain from ``start``, in seq order, for the Python checks
    (SQLite): ``(id, seq, hash, prev_hash, entry_hash, content, False, False, before)``, the two
    False meaning "not checked yet" and ``before`` the previous row's ``(seq, hash)``."""
    before = None
    with transaction.atomic(using=connection.alias), connection.chunked_cursor() as cursor:
        cursor.execute(_ROWS_SQL.format(timestamp="timestamp"), [chain, start])
        while rows := cursor.fetchmany(_CHUNK):
            for event_id, seq, stored, prev, sealed, *content in rows:
                yield event_id, seq, stored, prev, sealed, content, False, False, before
                before = (seq, stored)


def _composed(chain: str, *, chained: bool) -> tuple[str, list[str]]:
    """SQL composing a row's canonical JSON exactly as :func:`audit.writer.canonical_json` writes
    :func:`audit.writer.event_hash`'s material (``chained``) or :func:`audit.writer.entry_hash`'s,
    keys in sorted order. Strings go through ``to_json`` (PostgreSQL escapes ``"``, ``\\``,
    ``\\b\\f\\n\\r\\t`` and other controls as ``\\u00xx``, as Python's json does with
    ensure_ascii off); ``refs``/``payload`` are their stored ``json`` text, verbatim."""
    parts = [
        """'{"actor":' || to_json(actor)::text""",
        """',"chain":' || %s""",
        """',"outcome":' || to_json(outcome)::text""",
        """',"payload":' || payload::text""",
    ]
    if chained:
        parts.append("""',"prev_hash":"' || encode(prev_hash, 'hex') || '"'""")
    parts.append("""',"refs":' || refs::text""")
    if chained:
        parts.append("""',"seq":' || seq""")
    parts += [
        """',"stage":' || to_json(stage)::text""",
        """',"summary":' || to_json(summary)::text""",
        f"""',"timestamp":"' || {_PG_TIMESTAMP} || '"'""",
        """',"trace_id":' || to_json(trace_id)::text""",
        """',"type":' || to_json(type)::text""",
        """',"workspace_id":' || coalesce(workspace_id::text, 'null') || '}'""",
    ]
    return f"sha256(convert_to({' || '.join(parts)}, 'UTF8'))", [_encode_string(chain)]


def _rows_at(chain: str, seqs: list[int]) -> dict[int, tuple[int, bytes]]:
    """``{seq: (id, hash)}`` of the chain's rows at ``seqs`` (those that exist), by the (chain, seq) index."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT e.seq, e.id, e.hash FROM unnest(%s::bigint[]) AS s(seq)"
            " JOIN audit_auditevent e ON e.chain = %s AND e.seq = s.seq",
            [seqs, chain],
        )
        return {seq: (event_id, stored) for seq, event_id, stored in cursor.fetchall()}


# A range of a chain's walk worth its own process: below this the fork costs more than it saves.
_RANGE_MIN = 100_000


def _ranges(start: int, head_seq: int, jobs: int) -> list[tuple[int, int | None]]:
    """``[start, b1), [b1, b2), …, [bk, end)`` of about equal size up to the head (the last one
    open: rows sequenced after the head was read are walked too)."""
    parts = max(1, min(jobs, (head_seq - start + 1) // _RANGE_MIN))
    if parts == 1:
        return [(start, None)]
    size = (head_seq - start + 1) // parts
    bounds = [start + k * size for k in range(parts)]
    return [(lo, hi) for lo, hi in zip(bounds, [*bounds[1:], None], strict=True)]


def _parallel_walk(
    chain: str, ranges: list[tuple[int, int | None]], sealed_from: int, head_seq: int
) -> Iterator[tuple]:
    """:func:`_sql_walk` over ``ranges`` at once, one process each, yielded as one walk would.

    Each range's last row is among those returned, so the first row of the next range gets
    it as its predecessor here (a range that returned nothing leaves the row before it, and
    the seq gap shows)."""
    connections.close_all()  # fork with no connection open (none of the children shares its socket)
    with multiprocessing.get_context("fork").Pool(len(ranges), initializer=_child_init) as pool:
        parts = pool.map(
            functools.partial(_walk_range, chain, sealed_from=sealed_from, head_seq=head_seq), ranges
        )
    last = None
    for rows in parts:
        for n, row in enumerate(rows):
            if n == 0 and last is not None:
                row = (*row[:8], (last[1], last[2]))
            yield row
            last = row


def _walk_range(
    chain: str, bounds: tuple[int, int | None], *, sealed_from: int, head_seq: int
) -> list[tuple]:
    try:
        return list(_sql_walk(chain, bounds[0], sealed_from, head_seq, end=bounds[1]))
    finally:
        connections.close_all()


def _sql_walk(
    chain: str, start: int, sealed_from: int, head_seq: int, *, end: int | None = None
) -> Iterator[tuple]:
    """The chain's sequenced rows from ``start`` checked by PostgreSQL (PostgreSQL only).

    One pass over the (chain, seq) index: each row's canonical JSON is composed in SQL and
    hashed with the built-in ``sha256()`` (its entry hash too, from ``sealed_from``), and
    window functions give each row its predecessor's seq and hash. Only the rows that need
    a look come back, as :func:`_python_walk` yields them: the first and the last, any whose
    digest differs (the Python checks then decide: a row whose stored JSON text is not the
    canonical one but whose value is intact passes there), any not following its
    predecessor (a gap or a broken link), and the row at ``head_seq`` (the head row's).
    """
    event, event_params = _composed(chain, chained=True)
    entry, entry_params = _composed(chain, chained=False)
    sql = f"""
        SELECT id, seq, hash, prev_hash, entry_hash, {_PG_TIMESTAMP}, trace_id, stage, type, summary, outcome,
               workspace_id, refs::text, actor, payload::text, hash_ok, entry_ok, before_seq, before_hash
        FROM (
            SELECT e.*, coalesce({event} = hash, false) AS hash_ok,
                   CASE WHEN seq >= %s AND length(entry_hash) > 0
                        THEN coalesce({entry} = entry_hash, false) ELSE true END AS entry_ok,
                   lag(seq) OVER w AS before_seq, lag(hash) OVER w AS before_hash,
                   lead(seq) OVER w IS NULL AS last
            FROM audit_auditevent e WHERE chain = %s AND seq >= %s AND seq < %s
            WINDOW w AS (ORDER BY seq)
        ) v
        WHERE NOT hash_ok OR NOT entry_ok OR before_seq IS NULL OR last OR seq <> before_seq + 1
              OR prev_hash IS DISTINCT FROM before_hash OR seq = %s
        ORDER BY seq
    """  # noqa: S608 (no value is formatted into it)
    params = [
        *event_params,
        sealed_from,
        *entry_params,
        chain,
        start,
        2**63 - 1 if end is None else end,
        head_seq,
    ]
    with transaction.atomic(using=connection.alias), connection.chunked_cursor() as cursor:
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(_CHUNK):
            for (
                event_id,
                seq,
                stored,
                prev,
                sealed,
                *content,
                hash_ok,
                entry_ok,
                before_seq,
                before_hash,
            ) in rows:
                before = None if before_seq is None else (before_seq, before_hash)
                yield event_id, seq, stored, prev, sealed, content, hash_ok, entry_ok, before


class _ChainHasher:
    """``event_hash`` / ``entry_hash`` of raw rows of one chain, as bytes, without building dicts.

    The canonical JSON of the hashed fields is assembled in their sorted key order
    from the row's values, each encoded exactly as :func:`audit.writer.canonical_json`
    encodes it (strings by the same C escaper, ``refs``/``payload`` parsed and
    re-serialised, each distinct text once). Equal digests prove the row's content
    is the hashed content; a digest that differs is re-checked through
    :mod:`audit.writer` itself before anything is reported (:func:`_slow_check`).
    """

    def __init__(self, chain: str):
        self._chain = _encode_string(chain)
        self._json: dict[str, str] = {}

    def _canonical(self, value: Any) -> str:
        try:
            return self._json[value]
        except KeyError:
            if len(self._json) > 4096:
                self._json.clear()
            text = self._json[value] = canonical_json(json.loads(value))
            return text
        except TypeError:  # a backend that parsed the JSON already
            return canonical_json(value)

    def _parts(self, content: list) -> tuple[str, str, str]:
        timestamp, trace_id, stage, type_, summary, outcome, workspace_id, refs, actor, payload = content
        if isinstance(timestamp, str) and timestamp[10:11] != "T":  # SQLite: naive UTC text
            timestamp = datetime.fromisoformat(timestamp)
        if isinstance(timestamp, datetime):
            if timestamp.tzinfo is None:
                timestamp = timestamp.replace(tzinfo=UTC)
            timestamp = timestamp.isoformat(timespec="microseconds")
        front = (
            f'{{"actor":{_encode_string(actor)},"chain":{self._chain},"outcome":{_encode_string(outcome)},'
            f'"payload":{self._canonical(payload)},'
        )
        back = (
            f'"stage":{_encode_string(stage)},"summary":{_encode_string(summary)},'
            f'"timestamp":"{timestamp}",'
            f'"trace_id":{_encode_string(trace_id)},"type":{_encode_string(type_)},'
            f'"workspace_id":{"null" if workspace_id is None else int(workspace_id)}}}'
        )
        return front, f'"refs":{self._canonical(refs)},', back

    def event(self, seq: int, prev: bytes | None, content: list) -> bytes | None:
        try:
            front, refs, back = self._parts(content)
            link = "null" if prev is None else f'"{prev.hex()}"'
            return hashlib.sha256(f'{front}"prev_hash":{link},{refs}"seq":{seq},{back}'.encode()).digest()
        except (TypeError, ValueError, AttributeError):  # a value of the wrong type: the slow path names it
            return None

    def entry(self, content: list) -> bytes | None:
        try:
            front, refs, back = self._parts(content)
            return hashlib.sha256(f"{front}{refs}{back}".encode()).digest()
        except (TypeError, ValueError, AttributeError):
            return None


def _slow_check(event_id: int, column: str) -> bool:
    """Recompute one event's ``hash`` or ``entry_hash`` the writer's own way (model fields, dicts)."""
    names = HASHED_FIELDS if column == "hash" else CONTENT_FIELDS
    row = AuditEvent.objects.filter(pk=event_id).values_list(column, *names).first()
    if row is None:
        return False
    fields = dict(zip(names, row[1:], strict=True))
    try:
        digest = event_hash(fields) if column == "hash" else entry_hash(fields)
    except (TypeError, ValueError):
        return False
    return bool(row[0]) and digest == row[0]


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
    with connection.cursor() as cursor:
        cursor.execute(_EVENT_CHAINS_SQL)
        chains.update(chain for (chain,) in cursor.fetchall())
    return sorted(chains)


# The distinct chains of the events, one index probe per chain on (chain, seq) instead of a
# scan of the whole table: an incremental verification must not cost the whole history.
_EVENT_CHAINS_SQL = (
    "WITH RECURSIVE c(chain) AS (SELECT min(chain) FROM audit_auditevent UNION ALL"
    " SELECT (SELECT min(chain) FROM audit_auditevent WHERE chain > c.chain) FROM c WHERE c.chain IS NOT NULL)"
    " SELECT chain FROM c WHERE chain IS NOT NULL"
)


def verify_all(
    chains: Iterable[str] | None = None, *, since_checkpoint: bool = False, jobs: int | None = 1
) -> VerifyResult:
    """Verify ``chains`` (default: every chain in the ledger), stopping at the first broken one.

    ``jobs``: chains verified at once, each in its own process (PostgreSQL only; ``None``
    picks one per CPU outside a transaction, where a child's new connection sees the same
    data). The result is the same as one at a time: the counts of every chain, or the
    first broken chain in name order. With fewer chains than jobs, each chain's walk is
    cut into ranges walked at once instead (:func:`verify_chain`'s ``jobs``).
    """
    names = all_chains() if chains is None else sorted(set(chains))
    if jobs is None:
        jobs = (os.cpu_count() or 1) if not connection.in_atomic_block else 1
    per_chain = jobs if len(names) < jobs else 1
    jobs = min(jobs, len(names))
    results: Iterable[VerifyResult]
    if per_chain > 1:
        pool = None
        results = (verify_chain(chain, since_checkpoint=since_checkpoint, jobs=per_chain) for chain in names)
    elif jobs > 1 and connection.vendor == "postgresql" and not connection.in_atomic_block:
        # Fork with no connection open, so that no child shares the parent's socket.
        connections.close_all()
        pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_child_init)
        results = pool.imap(functools.partial(_verify_one, since_checkpoint=since_checkpoint), names)
    else:
        pool = None
        results = (verify_chain(chain, since_checkpoint=since_checkpoint) for chain in names)
    result = VerifyResult()
    try:
        for one in results:
            result.merge(one)
            if not result.ok:
                break
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    return result


def _child_init() -> None:
    # A range walker is ended by the pool's SIGTERM, whatever handler the forking process had.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    for conn in connections.all(initialized_only=True):
        conn.connection = None  # (closed before the fork; never reuse the parent's object)


def _verify_one(chain: str, *, since_checkpoint: bool) -> VerifyResult:
    try:
        return verify_chain(chain, since_checkpoint=since_checkpoint)
    finally:
        connections.close_all()
