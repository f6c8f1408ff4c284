"""The only way into the audit ledger.

Call :func:`append` inside the transaction that makes the change it records.
An append is a plain INSERT of an *unsequenced* entry: it takes no lock and
reads nothing, so concurrent writers of one workspace never wait for each
other. The entry's content is sealed by its ``entry_hash`` at once; the
sequencer (:mod:`audit.sequencer`) later gives it its ``seq`` and ``prev_hash``
and chains it (``hash``), in order, within the maximum merge delay. Several
events of one transaction go in one statement inside :func:`batch`.

``hash`` is :func:`event_hash` over the same canonical JSON as before the
sequencer existed, so verification and the offline verifier are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connections, router
from django.db.models.base import ModelState
from django.utils import timezone

from .models import AuditEvent, Outcome
from .redaction import redact

GENESIS_HASH = "0" * 64
HASHED_FIELDS = (
    "chain", "seq", "timestamp", "trace_id", "stage", "type", "summary",
    "outcome", "workspace_id", "refs", "actor", "payload", "prev_hash",
)  # fmt: skip
# What an entry is, apart from its place in the chain (which the sequencer gives it).
CONTENT_FIELDS = tuple(name for name in HASHED_FIELDS if name not in ("seq", "prev_hash"))
_FIELD_LIMITS = {"trace_id": 64, "type": 64, "stage": 32}


def actor_for(user) -> str:
    """How a person appears in the ledger's ``actor`` field."""
    return f"user:{user.get_username()}" if user is not None and user.is_authenticated else "system"


def chain_for(workspace_id: int | None) -> str:
    return f"ws-{workspace_id}" if workspace_id is not None else "platform"


# One encoder instance: json.dumps(..., cls=...) would build a new one per call.
_ENCODER = DjangoJSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_encode_text = json.encoder.encode_basestring  # what _ENCODER writes a str as (see _entry_hash)
# The C encoder _ENCODER.encode makes afresh on every call (~2.5 us of its ~5), made once. Without
# the circular-reference check (its per-call memo): a value that contains itself fails with
# RecursionError instead of ValueError; no audited value can be one.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)  # None without json's C accelerator
_C_ENCODE = (
    None if _c_make_encoder is None
    else _c_make_encoder(None, _ENCODER.default, _encode_text, None, ":", ",", True, False, True)
)  # fmt: skip
_OUTCOMES = frozenset(Outcome.values)


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, non-ASCII kept: the serialisation every hash is taken over."""
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return "".join(_C_ENCODE(value, 0))


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
    return _jsonable_text(value)[0]


# In a canonical text, what _clean may change: a NUL, NaN or an infinity, -0.0, a float of 1e16
# or more (repr writes those with an exponent). Seen anywhere (in a string too), the text is made
# afresh from the cleaned value, as it is when the text is not UTF-8 (a lone surrogate).
_UNCLEAN = re.compile(r"\\u0000|NaN|Infinity|-0\.0|e\+")


class _Unsorted(Exception):
    pass


def _sorted_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # An object whose keys are not strictly increasing came from keys that were not all
    # strings (1 and "1", 10 and 9): the cleaned value's own encoding sorts them otherwise.
    for i in range(1, len(pairs)):
        if pairs[i - 1][0] >= pairs[i][0]:
            raise _Unsorted
    return dict(pairs)


_SORTED_DECODER = json.JSONDecoder(object_pairs_hook=_sorted_object)


def _jsonable_text(value: Any) -> tuple[Any, str]:
    """``value`` as it comes back from the database (a fresh copy, see :func:`_clean`) and its
    canonical JSON: the same text as ``canonical_json(_jsonable(value))``, most often without
    encoding twice."""
    text = canonical_json(value)
    if _UNCLEAN.search(text) or not _utf8(text):
        clean = _clean(json.loads(text))
        return clean, canonical_json(clean)
    try:
        return _SORTED_DECODER.decode(text), text
    except _Unsorted:
        clean = _clean(json.loads(text))
        return clean, canonical_json(clean)


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _cap_payload(payload: dict[str, Any], text: str | None = None) -> tuple[dict[str, Any], str]:
    """The payload, or what stands for it when it is too large; with its canonical JSON."""
    text = canonical_json(payload) if text is None else text
    size = len(text.encode())
    limit = settings.AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES
    if size <= limit:
        return payload, text
    capped = {
        "truncated": True,
        "original_bytes": size,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "preview": _clean_text(text[: min(2048, limit // 2)]),
    }
    return capped, canonical_json(capped)


def entry_hash(fields: dict[str, Any]) -> str:
    """sha256 over the canonical serialisation of an entry's content (everything but its place in the chain).

    Sealed at append; the sequencer recomputes it before it chains the entry, so
    an entry altered while it waits is refused rather than vouched for.
    """
    material = {name: fields[name] for name in CONTENT_FIELDS}
    material["timestamp"] = format_timestamp(material["timestamp"])
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def _entry_hash(fields: dict[str, Any], refs: str, payload: str) -> str:
    """:func:`entry_hash`, given the canonical JSON of refs and payload: the same text, spliced.

    The canonical JSON of a dict is its sorted keys' ``"key":value`` pairs joined by commas in
    braces, each value encoded on its own (a string by ``encode_basestring``, as the encoder
    does without ``ensure_ascii``); the content fields sort as actor, chain, outcome, payload,
    refs, stage, summary, timestamp, trace_id, type, workspace_id. All but the last are text."""
    text = _encode_text
    workspace_id = fields["workspace_id"]
    material = (
        f'{{"actor":{text(fields["actor"])},"chain":{text(fields["chain"])},"outcome":{text(fields["outcome"])},'
        f'"payload":{payload},"refs":{refs},"stage":{text(fields["stage"])},"summary":{text(fields["summary"])},'
        f'"timestamp":{text(format_timestamp(fields["timestamp"]))},"trace_id":{text(fields["trace_id"])},'
        f'"type":{text(fields["type"])},"workspace_id":{"null" if workspace_id is None else int(workspace_id)}}}'
    )
    return hashlib.sha256(material.encode()).hexdigest()


_COLUMNS = ("chain", "timestamp", "trace_id", "stage", "type", "summary", "outcome",
            "workspace_id", "refs", "actor", "payload", "entry_hash")  # fmt: skip
_PG_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s::json, %s, %s::json, %s)"
_SQLITE_ROW = "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"


def _insert_sql(
    connection, entries: list[dict[str, Any]], *, returning: bool = True
) -> tuple[str, list[Any]]:
    """One INSERT for all ``entries``: no lock, no read, nothing shared with other writers."""
    row = _PG_ROW if connection.vendor == "postgresql" else _SQLITE_ROW
    params: list[Any] = []
    for fields in entries:
        timestamp = fields["timestamp"]
        if connection.vendor != "postgresql":
            timestamp = connection.ops.adapt_datetimefield_value(timestamp)
        params += [
            fields["chain"], timestamp, fields["trace_id"], fields["stage"], fields["type"], fields["summary"],
            fields["outcome"], fields["workspace_id"], _text(fields, "refs"), fields["actor"],
            _text(fields, "payload"), bytes.fromhex(fields["entry_hash"]),
        ]  # fmt: skip
    # Placeholders only: no value is ever formatted into the statement.
    rows = ", ".join([row] * len(entries))
    sql = f"INSERT INTO audit_auditevent ({', '.join(_COLUMNS)}) VALUES {rows}"  # noqa: S608
    return (sql + " RETURNING id" if returning else sql), params


def _insert(connection, entries: list[dict[str, Any]], *, events: bool = True) -> list[AuditEvent]:
    """Write ``entries`` in one INSERT. Returns the saved events (none when ``events`` is false:
    a batch's caller has no use for them)."""
    sql, params = _insert_sql(connection, entries)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        ids = [r[0] for r in cursor.fetchall()]
    if not events:
        return []
    saved = []
    for event_id, fields in zip(sorted(ids), entries, strict=True):
        event = _event(fields, id=event_id)
        event._state.adding = False
        event._state.db = connection.alias
        saved.append(event)
    return saved


def _text(fields: dict[str, Any], name: str) -> str:
    """The canonical JSON of ``fields[name]`` (refs or payload), as :func:`_fields` made it."""
    texts = fields.get(_TEXTS)
    return texts[name] if texts is not None else canonical_json(fields[name])


_TEXTS = "_texts"  # in the fields _fields returns: the canonical JSON of refs and payload
_UNSET = {field.attname: None for field in AuditEvent._meta.concrete_fields}


def _event(fields: dict[str, Any], id: int | None = None) -> AuditEvent:
    """``AuditEvent(id=id, **fields)`` (without its texts), made without Model.__init__'s cost:
    every column is in ``fields`` but the id and the three a sequencer fills (None until then)."""
    event = AuditEvent.__new__(AuditEvent)
    event.__dict__.update(_UNSET)
    event.__dict__.update(fields)
    event.__dict__.pop(_TEXTS, None)
    event.id = id
    event._state = ModelState()
    return event


class _Batch(threading.local):
    entries: list[dict[str, Any]] | None = None


_batch = _Batch()


@contextmanager
def batch() -> Iterator[None]:
    """Collect the appends made inside the block and write them in one INSERT when it ends.

    Use it inside the transaction that makes the changes recorded, e.g. around a
    step's bookkeeping. Nested blocks join the outermost one. If the block raises,
    nothing is written (the caller's transaction is failing anyway).
    """
    if _batch.entries is not None:
        yield
        return
    _batch.entries = []
    try:
        yield
        entries = _batch.entries
    finally:
        _batch.entries = None
    if entries:
        _insert(connections[router.db_for_write(AuditEvent)], entries, events=False)


def batch_statement() -> tuple[str, list[Any]] | None:
    """The INSERT of the appends collected so far in :func:`batch`, taken out of it (None: none yet).

    For a caller that sends it with its other writes in one round trip
    (:func:`config.one_round_trip.send`); what is appended later still goes in the
    batch's own INSERT.
    """
    entries = _batch.entries
    if not entries:
        return None
    _batch.entries = []
    return _insert_sql(connections[router.db_for_write(AuditEvent)], entries, returning=False)


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
    """Append one event to its workspace's chain (unsequenced: see :mod:`audit.sequencer`) and return it.

    Inside :func:`batch` the event is written when the block ends (and returned unsaved).

    ``secrets`` are values (credential material, tokens) that must never be
    stored: every occurrence in summary, refs or payload becomes ``[REDACTED]``.
    A payload larger than ``AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES`` is replaced by
    its size, sha256 and a short preview.
    """
    fields = _fields(trace_id=trace_id, type=type, summary=summary, outcome=outcome, workspace_id=workspace_id,
                     stage=stage, refs=refs, actor=actor, payload=payload, secrets=secrets)  # fmt: skip
    if _batch.entries is not None:
        _batch.entries.append(fields)
        return _event(fields)
    connection = connections[router.db_for_write(AuditEvent)]
    if connection.vendor not in ("postgresql", "sqlite"):
        raise NotImplementedError(f"the audit ledger supports PostgreSQL and SQLite, not {connection.vendor}")
    return _insert(connection, [fields])[0]


def statement(**kwargs: Any) -> tuple[str, list[Any]]:
    """The INSERT that :func:`append` (same arguments) would send, for a caller that sends it
    with other writes in one round trip (:mod:`config.one_round_trip`)."""
    return _insert_sql(connections[router.db_for_write(AuditEvent)], [_fields(**kwargs)], returning=False)


def _fields(
    *, trace_id: str, type: str, summary: str, outcome: str = Outcome.INFO, workspace_id: int | None = None,
    stage: str = "", refs: dict[str, Any] | None = None, actor: str = "system",
    payload: dict[str, Any] | None = None, secrets: Iterable[str] = (),
) -> dict[str, Any]:  # fmt: skip
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
        "actor": _clean_text(str(actor))[:200],
    }
    for name, limit in _FIELD_LIMITS.items():
        if len(fields[name]) > limit:
            raise ValueError(f"audit {name} longer than {limit} characters")
    fields["refs"], refs_text = _jsonable_text(redact(refs or {}, secrets) if secrets else refs or {})
    fields["payload"], payload_text = _cap_payload(
        *_jsonable_text(redact(payload or {}, secrets) if secrets else payload or {})
    )
    fields["timestamp"] = timezone.now()
    fields["entry_hash"] = _entry_hash(fields, refs_text, payload_text)
    fields[_TEXTS] = {"refs": refs_text, "payload": payload_text}
    return fields
