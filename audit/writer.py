"""The only way into the audit ledger.

Call :func:`append` inside the transaction that makes the change it records.
Each chain (one per workspace, plus ``platform``) is serialised by locking its
head row, so concurrent writers from many processes keep one valid chain while
different workspaces append in parallel. The lock is held until the caller's
transaction ends, so append as late in the transaction as is natural.

On PostgreSQL an append is one SQL statement (move the head, which locks it,
computing the hash on the way; insert the row): the database computes sha256 over the same
canonical JSON that :func:`event_hash` builds, with ``prev_hash``, ``seq`` and
``timestamp`` filled in under the lock. On SQLite, where a write transaction
holds the database's one write lock, it is four short statements with the hash
computed here. Both paths produce rows that :func:`event_hash` reproduces exactly.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router, transaction
from django.utils import timezone

from .models import AuditEvent, Outcome
from .redaction import redact

GENESIS_HASH = "0" * 64
HASHED_FIELDS = (
    "chain", "seq", "timestamp", "trace_id", "stage", "type", "summary",
    "outcome", "workspace_id", "refs", "actor", "payload", "prev_hash",
)  # fmt: skip
# The fields the database fills in under the chain lock, in canonical (sorted) order.
_LOCKED_FIELDS = ("prev_hash", "seq", "timestamp")
# (name, '"name":' with its leading comma) in canonical (sorted) order.
_SORTED_KEYS = [
    (name, ("," if i else "") + json.dumps(name) + ":") for i, name in enumerate(sorted(HASHED_FIELDS))
]
_FIELD_LIMITS = {"trace_id": 64, "type": 64, "stage": 32}


def actor_for(user) -> str:
    """How a person appears in the ledger's ``actor`` field."""
    return f"user:{user.get_username()}" if user is not None and user.is_authenticated else "system"


def chain_for(workspace_id: int | None) -> str:
    return f"ws-{workspace_id}" if workspace_id is not None else "platform"


# One encoder instance: json.dumps(..., cls=...) would build a new one per call.
_ENCODER = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_OUTCOMES = frozenset(Outcome.values)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept: the serialisation every hash is taken over."""
    return _ENCODER.encode(value)


def format_timestamp(value: Any) -> str:
    return value.isoformat(timespec="microseconds") if hasattr(value, "isoformat") else value


def event_hash(fields: dict[str, Any]) -> str:
    """sha256 over the canonical serialisation of the hashed fields (including ``prev_hash``)."""
    material = {name: fields[name] for name in HASHED_FIELDS}
    material["timestamp"] = format_timestamp(material["timestamp"])
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def _clean_text(value: str) -> str:
    # PostgreSQL text and jsonb cannot hold NUL, and lone surrogates cannot be encoded.
    if "\x00" in value:
        value = value.replace("\x00", "\ufffd")
    try:
        value.encode()
    except UnicodeEncodeError:
        value = value.encode("utf-8", "replace").decode()
    return value


def _clean(value: Any) -> Any:
    """Make JSON data survive a database round trip unchanged, so its hash does too.

    jsonb keeps numbers as decimals: ``1e+16`` comes back as the integer
    ``10000000000000000`` and ``-0.0`` as ``0.0``; NaN and infinities are not JSON.
    """
    if isinstance(value, str):
        return _clean_text(value)
    if isinstance(value, dict):
        return {_clean_text(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value == 0:
            return 0.0
        if value.is_integer() and abs(value) >= 1e16:
            return int(value)
    return value


def _jsonable(value: Any) -> Any:
    return _clean(json.loads(canonical_json(value)))


def _cap_payload(payload: dict[str, Any]) -> dict[str, Any]:
    text = canonical_json(payload)
    size = len(text.encode())
    limit = settings.AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES
    if size <= limit:
        return payload
    return {
        "truncated": True,
        "original_bytes": size,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "preview": _clean_text(text[: min(2048, limit // 2)]),
    }


def _hash_text_parts(fields: dict[str, Any]) -> list[str]:
    """The canonical JSON of an event split around ``prev_hash``, ``seq`` and ``timestamp``.

    ``parts[0] + prev_hash + parts[1] + str(seq) + parts[2] + timestamp + parts[3]``
    equals the text :func:`event_hash` hashes (tested).
    """
    parts: list[str] = []
    buf = "{"
    for name, key in _SORTED_KEYS:
        buf += key
        if name in _LOCKED_FIELDS:
            quote = "" if name == "seq" else '"'
            parts.append(buf + quote)
            buf = quote
        else:
            buf += canonical_json(fields[name])
    parts.append(buf + "}")
    return parts


# One UPDATE moves the head: its row lock serialises the chain (a concurrent
# append waits, then re-evaluates SET against the row as committed), SET sees the
# old values and RETURNING the new ones, so prev_hash is the old head_hash. The
# timestamp is the database clock, kept strictly increasing along the chain.
# Parameters carry explicit casts: the statement is bound server-side and prepared.
_PG_APPEND = """
WITH moved AS (
    UPDATE audit_auditchainhead AS h
    SET seq = h.seq + 1,
        prev_hash = h.head_hash,
        last_timestamp = GREATEST(c.now, h.last_timestamp + interval '1 microsecond'),
        head_hash = encode(sha256(convert_to(
            %(p0)s::text || h.head_hash || %(p1)s::text || (h.seq + 1)::text || %(p2)s::text
            || to_char(GREATEST(c.now, h.last_timestamp + interval '1 microsecond') AT TIME ZONE 'UTC',
                       'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
            || %(p3)s::text, 'UTF8')), 'hex')
    FROM (SELECT clock_timestamp() AS now) AS c
    WHERE h.chain = %(chain)s::text
    RETURNING h.seq, h.last_timestamp, h.prev_hash, h.head_hash
)
INSERT INTO audit_auditevent
    (chain, seq, timestamp, trace_id, stage, type, summary, outcome,
     workspace_id, refs, actor, payload, prev_hash, hash)
SELECT %(chain)s::text, moved.seq, moved.last_timestamp, %(trace_id)s::text, %(stage)s::text, %(type)s::text,
       %(summary)s::text, %(outcome)s::text, %(workspace_id)s::bigint, %(refs)s::text::jsonb,
       %(actor)s::text, %(payload)s::text::jsonb, moved.prev_hash, moved.head_hash
FROM moved
RETURNING id, seq, timestamp, prev_hash, hash
"""
_PG_CREATE_HEAD = """
INSERT INTO audit_auditchainhead (chain, seq, head_hash, prev_hash)
VALUES (%(chain)s::text, 0, %(genesis)s::text, %(genesis)s::text)
ON CONFLICT (chain) DO NOTHING
"""


def _pg_cursor(connection):
    """A server-side-binding psycopg cursor on Django's connection (and so in its transaction).

    Django binds parameters client-side and disables prepared statements (for
    transaction-pooling PgBouncers). The append statement is long and hot, and
    prepared it skips ~0.1 ms of planning per event; set
    ``AUTOPLANE_AUDIT_PREPARED_STATEMENTS = False`` behind a pooler that cannot
    keep prepared statements (PgBouncer < 1.21, or ``max_prepared_statements = 0``).
    """
    import psycopg

    connection.ensure_connection()
    connection.validate_no_broken_transaction()
    return psycopg.Cursor(connection.connection)


def _append_postgresql(connection, fields: dict[str, Any]) -> AuditEvent:
    p0, p1, p2, p3 = _hash_text_parts(fields)
    params = {
        **fields,
        "refs": canonical_json(fields["refs"]),
        "payload": canonical_json(fields["payload"]),
        "p0": p0,
        "p1": p1,
        "p2": p2,
        "p3": p3,
    }
    prepare = bool(settings.AUTOPLANE_AUDIT_PREPARED_STATEMENTS)
    with connection.wrap_database_errors, _pg_cursor(connection) as cursor:
        cursor.execute(_PG_APPEND, params, prepare=prepare)
        row = cursor.fetchone()
        if row is None:  # first event of this chain
            cursor.execute(_PG_CREATE_HEAD, {"chain": fields["chain"], "genesis": GENESIS_HASH})
            cursor.execute(_PG_APPEND, params, prepare=prepare)
            row = cursor.fetchone()
    event_id, seq, ts, prev_hash, hash_ = row
    event = AuditEvent(id=event_id, seq=seq, timestamp=ts, prev_hash=prev_hash, hash=hash_, **fields)
    event._state.adding = False
    event._state.db = connection.alias
    return event


_SQLITE_INSERT = """
INSERT INTO audit_auditevent
    (chain, seq, timestamp, trace_id, stage, type, summary, outcome,
     workspace_id, refs, actor, payload, prev_hash, hash)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def _append_sqlite(connection, fields: dict[str, Any]) -> AuditEvent:
    # SQLite has one writer at a time. Moving the head first takes the write lock
    # even in a DEFERRED transaction, so the head read next cannot be stale.
    # savepoint=False: a failed append must fail the caller's transaction anyway.
    chain = fields["chain"]
    with transaction.atomic(using=connection.alias, savepoint=False), connection.cursor() as cursor:
        cursor.execute("UPDATE audit_auditchainhead SET seq = seq + 1 WHERE chain = %s", [chain])
        if cursor.rowcount == 0:
            cursor.execute(
                "INSERT INTO audit_auditchainhead (chain, seq, head_hash, prev_hash) VALUES (%s, 1, %s, %s)",
                [chain, GENESIS_HASH, GENESIS_HASH],
            )
        cursor.execute("SELECT seq, head_hash FROM audit_auditchainhead WHERE chain = %s", [chain])
        seq, prev_hash = cursor.fetchone()
        # Taken under the write lock, so timestamps increase along the chain.
        fields.update(seq=seq, prev_hash=prev_hash, timestamp=timezone.now())
        fields["hash"] = event_hash(fields)
        timestamp = connection.ops.adapt_datetimefield_value(fields["timestamp"])
        cursor.execute(
            _SQLITE_INSERT,
            [
                chain, seq, timestamp, fields["trace_id"],
                fields["stage"], fields["type"], fields["summary"], fields["outcome"], fields["workspace_id"],
                canonical_json(fields["refs"]), fields["actor"], canonical_json(fields["payload"]),
                prev_hash, fields["hash"],
            ],
        )  # fmt: skip
        event_id = cursor.lastrowid
        cursor.execute(
            "UPDATE audit_auditchainhead SET head_hash = %s, prev_hash = %s, last_timestamp = %s WHERE chain = %s",
            [fields["hash"], prev_hash, timestamp, chain],
        )
    event = AuditEvent(id=event_id, **fields)
    event._state.adding = False
    event._state.db = connection.alias
    return event


def append(
    *,
    trace_id: str,
    type: str,
    summary: str,
    outcome: str = Outcome.INFO,
    workspace_id: int | None = None,
    stage: str = "",
    refs: dict[str, Any] | None = None,
    actor: str = "system",
    payload: dict[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> AuditEvent:
    """Append one event to its workspace's chain and return it.

    ``secrets`` are values (credential material, tokens) that must never be
    stored: every occurrence in summary, refs or payload becomes ``[REDACTED]``.
    A payload larger than ``AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES`` is replaced by
    its size, sha256 and a short preview.
    """
    if not trace_id:
        raise ValueError("audit events require a trace_id")
    if outcome not in _OUTCOMES:
        raise ValueError(f"unknown audit outcome {outcome!r}")
    secrets = list(secrets)
    fields: dict[str, Any] = {
        "chain": chain_for(workspace_id),
        "trace_id": _clean_text(str(trace_id)),
        "stage": _clean_text(str(stage)),
        "type": _clean_text(str(type)),
        "summary": _clean_text(redact(str(summary), secrets))[:500],
        "outcome": str(outcome),
        "workspace_id": None if workspace_id is None else int(workspace_id),
        "refs": _jsonable(redact(refs or {}, secrets)),
        "actor": _clean_text(str(actor))[:200],
        "payload": _cap_payload(_jsonable(redact(payload or {}, secrets))),
    }
    for name, limit in _FIELD_LIMITS.items():
        if len(fields[name]) > limit:
            raise ValueError(f"audit {name} longer than {limit} characters")
    connection = connections[router.db_for_write(AuditEvent)]
    if connection.vendor == "postgresql":
        return _append_postgresql(connection, fields)
    if connection.vendor == "sqlite":
        return _append_sqlite(connection, fields)
    raise NotImplementedError(f"the audit ledger supports PostgreSQL and SQLite, not {connection.vendor}")
