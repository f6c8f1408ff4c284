"""The webhook fire service (SPEC §6.2): ``POST /api/v1/automations/{id}/fire``.

Checks, in order, each answered with a stable code and audited as
``webhook.rejected`` (never with the token, which is passed as a secret):

1. ``Authorization: Bearer <token>`` (only that header: never a query parameter,
   a body field or a cookie). The token is looked up by its sha256 and compared in
   constant time; it must belong to a webhook trigger of *this* automation that is
   enabled, not revoked, with the automation active. Every failure is the same 401,
   byte for byte (one code and message, rendered by the API error handler, +
   ``WWW-Authenticate: Bearer``). A valid token of an archived automation gets 410
   ``GONE`` (its holder may learn that much).
2. The per-trigger rate limit (``rate_limit_per_minute``, default 600): a fixed
   one-minute window counted in Redis when the broker is Redis (one INCR + EXPIRE
   round trip, no database commit per fire), else in the database with one atomic
   upsert, so it holds across gunicorn workers and machines; over it → 429 with ``Retry-After`` (the
   seconds until the window ends).
3. ``Content-Type: application/json`` (charset utf-8 if given), no ``Content-Encoding``
   (gzip and the like are not supported) → else 415.
4. Body ≤ 256 KB, by ``Content-Length`` and by what is actually read → else 413.
5. Standard Webhooks signature when the trigger's ``require_signature`` is true:
   ``webhook-signature: v1,<base64 HMAC-SHA256(secret, "<id>.<timestamp>.<body>")>``
   (space-separated list; any match passes), timestamp within 5 minutes → else 401
   ``INVALID_SIGNATURE``.
6. The body must be a JSON object, strict (:mod:`config.strict_json`): UTF-8, no
   NaN/Infinity, finite numbers, integers within 64 bits, nesting ≤ 64, no duplicate keys,
   no NUL or lone surrogates in strings or keys → else 400.
7. The dedupe key: a verified ``webhook-id`` whenever the signature was checked (whatever
   ``Idempotency-Key`` says: the header is not signed, so a replay may add, drop or
   change it); else the ``Idempotency-Key`` header, else an ``idempotency_key`` string in
   the body; ≤ 255 characters, deduplicated per trigger for 24 h by
   the dispatcher: same key + same body → the original run (200); a different body
   → 422; still being accepted → 409.

Inputs: the body is the run's ``trigger`` payload. With an ``input_mapping`` the
inputs are the mapped values (see :mod:`triggers.input_mapping`); without one the
inputs are the body itself, less a top-level ``idempotency_key``.

Failed authentication is rate-limited per client address and per automation, and
rejections are recorded in the ledger one by one only up to a quota per window, then
as one summary row with a count (:mod:`triggers.rejections`).

A rejection writes nothing but its audit event or count (and, past step 2, the rate-limit
count the attempt used): the run, its dedupe key and ``last_fired_at`` are written
in one transaction that a failed dispatch rolls back.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import logging
import time
import uuid
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from hashlib import sha256
from importlib import import_module
from typing import Any

from django.conf import settings
from django.db import connection, connections, router, transaction
from django.utils import timezone

from automations.dispatcher import (
    Dedupe,
    DispatchError,
    DispatchRequest,
    DispatchResult,
    dispatch,
    request_hash,
)
from automations.models import Automation, AutomationStatus
from config import instruments, one_round_trip, strict_json
from config.errors import ServiceError
from config.strict_json import BodyInvalid

from . import rejections, services
from .input_mapping import MappingError, map_inputs
from .models import Trigger, TriggerType, WebhookRateWindow

logger = logging.getLogger(__name__)
# Imported on the first fire counted in Redis only: the embedded lane never loads redis.
REDIS_RATE_LIMIT_MODULE = "triggers.rate_limit_redis"

MAX_BODY_BYTES = 256 * 1024
MAX_TOKEN_CHARS = 200
MAX_IDEMPOTENCY_KEY_CHARS = 255
DEFAULT_RATE_LIMIT_PER_MINUTE = 600
SIGNATURE_TOLERANCE_SECONDS = 300
MAX_SIGNATURE_HEADER_CHARS = 4096


ARCHIVED = "automation archived"


class WebhookRejected(ServiceError):
    """A fire that is refused with ``http_status`` and ``code``/``message`` (or ``errors``).

    ``reason`` is the detail kept in the audit row only; the caller sees ``message``.
    """

    def __init__(
        self, http_status: int, code: str, message: str, *, reason: str = "",
        headers: dict[str, str] | None = None, errors: list[dict] | None = None,
    ):  # fmt: skip
        super().__init__(code, message, http_status, errors=errors, headers=headers)
        self.reason = reason or message


@dataclass
class FireRequest:
    """What the view hands over from the HTTP request; nothing else is trusted."""

    automation_id: str
    headers: Mapping[str, str]  # case-insensitive (Django's HttpHeaders)
    content_length: str | None
    read_body: Callable[[int], bytes]
    remote_addr: str = ""


# --- authentication -----------------------------------------------------------------


def _bearer(authorization: str | None) -> str | None:
    """The token of exactly ``Bearer <token>`` (RFC 6750: one space, no other whitespace)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if (
        scheme.lower() != "bearer"
        or not token
        or len(token) > MAX_TOKEN_CHARS
        or token != "".join(token.split())
    ):
        return None
    return token


def _addressed(request: FireRequest) -> uuid.UUID | None:
    try:
        return uuid.UUID(request.automation_id)
    except (ValueError, AttributeError, TypeError):
        return None


@dataclass(frozen=True)
class _TokenLookup:
    """The trigger-by-token SELECT (its automation joined), compiled once per connection."""

    sql: str
    converters: dict[int, tuple[list, Any]]
    trigger_fields: list[str]
    automation_fields: list[str]
    split: int  # the trigger's columns, then the automation's
    end: int


_token_lookups: weakref.WeakKeyDictionary[Any, _TokenLookup] = weakref.WeakKeyDictionary()
_HASH_PLACEHOLDER = "0" * 64


def _token_lookup(conn) -> _TokenLookup:
    """The ORM's own SELECT (``select_related``, no ORDER BY: the hash is unique), compiled once.

    Compiling the queryset on every fire was a third of the fire's Python work; the
    statement, its columns and their converters never change for a connection.
    """
    lookup = _token_lookups.get(conn)
    if lookup is not None:
        return lookup
    query = (
        Trigger.objects.select_related("automation").filter(token_hash=_HASH_PLACEHOLDER).order_by()[:1].query
    )
    compiler = query.get_compiler(connection=conn)
    sql, params = compiler.as_sql()
    if list(params) != [_HASH_PLACEHOLDER]:
        raise RuntimeError(f"unexpected parameters in the token lookup: {params!r}")
    select, info = compiler.select, compiler.klass_info
    [related] = info["related_klass_infos"]
    own, joined = info["select_fields"], related["select_fields"]
    if own != list(range(len(own))) or joined != list(range(len(own), len(own) + len(joined))):
        raise RuntimeError("unexpected column layout in the token lookup")
    if sql.count("%s") != 1:
        raise RuntimeError("unexpected placeholders in the token lookup")
    lookup = _TokenLookup(
        sql=sql,
        converters=compiler.get_converters([col for col, _, _ in select[: len(own) + len(joined)]]),
        trigger_fields=[col.target.attname for col, _, _ in select[: len(own)]],
        automation_fields=[col.target.attname for col, _, _ in select[len(own) : len(own) + len(joined)]],
        split=len(own),
        end=len(own) + len(joined),
    )
    _token_lookups[conn] = lookup
    return lookup


def trigger_by_token_hash(digest: str) -> Trigger | None:
    """The trigger whose token hashes to ``digest``, its automation loaded: one SELECT.

    What ``Trigger.objects.select_related("automation").get(token_hash=digest)`` returns
    (the same instances, from the same converters), without building and compiling
    the queryset on every fire.
    """
    conn = connections[router.db_for_read(Trigger)]
    lookup = _token_lookup(conn)
    # On PostgreSQL a statement prepared once per database session (config.one_round_trip, as
    # text with AUTOPLANE_PREPARED_STATEMENTS=off): PostgreSQL would otherwise parse and plan the
    # lookup's 1.3 kB of SQL on every fire (~0.08 ms). The row is still read on every fire (a
    # revoked or rotated token is seen at once); only the plan is kept.
    found = one_round_trip.select(lookup.sql, [digest], using=conn.alias)
    if not found:
        return None
    row = list(found[0])
    for position, (functions, expression) in lookup.converters.items():
        value = row[position]
        for function in functions:
            value = function(value, expression, conn)
        row[position] = value
    trigger = Trigger.from_db(conn.alias, lookup.trigger_fields, row[: lookup.split])
    automation = Automation.from_db(conn.alias, lookup.automation_fields, row[lookup.split : lookup.end])
    Trigger.automation.field.set_cached_value(trigger, automation)
    return trigger


def _authenticate(request: FireRequest) -> tuple[Trigger | None, str, str | None]:
    """``(trigger, reason, token)``: the trigger when the token may fire this automation, else why not.

    The same work (hash, one indexed lookup) is done whatever the outcome.
    """
    token = _bearer(request.headers.get("Authorization"))
    if token is None:
        return None, "missing or malformed Authorization header", None
    digest = services.token_hash(token)
    trigger = trigger_by_token_hash(digest)
    if trigger is None or not hmac.compare_digest(trigger.token_hash or "", digest):
        return None, "unknown token", token
    if trigger.automation_id != _addressed(request):
        return None, "token of another automation", token
    if trigger.type != TriggerType.WEBHOOK:
        return None, "not a webhook trigger", token
    if trigger.token_revoked_at is not None:
        return None, "revoked token", token
    if trigger.automation.archived_at is not None:
        return None, ARCHIVED, token
    if not trigger.enabled:
        return None, "trigger disabled", token
    if trigger.automation.status != AutomationStatus.ACTIVE:
        return None, "automation paused", token
    return trigger, "", token


def webhook_principals(trigger: Trigger) -> tuple[int, ...]:
    """The people behind a fire, for four-eyes: who rotated the token in, who owns the automation."""
    return tuple(
        pk for pk in (trigger.token_rotated_by_id, trigger.automation.created_by_id) if pk is not None
    )


# --- rate limit -----------------------------------------------------------------------


def rate_limit_hit(trigger: Trigger, limit: int, now: float | None = None) -> int | None:
    """Count one attempt; ``None`` when within ``limit`` per minute, else the seconds to wait."""
    return rate_limit_start(trigger, limit, now)()


def rate_limit_start(trigger: Trigger, limit: int, now: float | None = None) -> Callable[[], int | None]:
    """Count one attempt as :func:`rate_limit_hit` does, in two halves: this call sends the count to
    Redis, the function it returns reads the answer (``None`` or the seconds to wait), so that the
    caller can do its own work meanwhile. In the database the count is made by the second half."""
    now = time.time() if now is None else now
    window = int(now // 60)
    url = settings.AUTOPLANE_RATE_LIMIT_REDIS_URL
    redis_hits = (
        import_module(REDIS_RATE_LIMIT_MODULE).count_start(
            url, f"autoplane:webhook-rate:{trigger.pk}:{window}"
        )
        if url
        else None
    )

    def answer() -> int | None:
        hits = redis_hits() if redis_hits is not None else None
        if hits is None:
            hits = _database_hits(trigger, window)
        if hits <= limit:
            return None
        return max(1, int((window + 1) * 60 - now + 0.999))

    return answer


def _database_hits(trigger: Trigger, window: int) -> int:
    """The window's count after this attempt: one atomic upsert (its own implicit transaction)."""
    table = connection.ops.quote_name(WebhookRateWindow._meta.db_table)
    trigger_id = Trigger._meta.pk.get_db_prep_value(trigger.pk, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (trigger_id, window_start, hits) VALUES (%s, %s, 1) "  # noqa: S608 - names only
            f"ON CONFLICT (trigger_id, window_start) DO UPDATE SET hits = {table}.hits + 1 RETURNING hits",
            [trigger_id, window],
        )
        hits = cursor.fetchone()[0]
        if hits == 1:  # a new window: forget the ones before the previous
            cursor.execute(f"DELETE FROM {table} WHERE trigger_id = %s AND window_start < %s",  # noqa: S608
                           [trigger_id, window - 1])  # fmt: skip
    return hits


# --- body ------------------------------------------------------------------------------


def _is_json(content_type: str | None) -> bool:
    if not content_type:
        return False
    media, *params = [part.strip().lower() for part in content_type.split(";")]
    if media != "application/json":
        return False
    for param in params:
        name, _, value = param.partition("=")
        if name.strip() == "charset" and value.strip().strip('"') not in ("utf-8", "utf8"):
            return False
    return True


def parse_body(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or BodyInvalid with a message safe to show the caller."""
    value = strict_json.loads(raw)
    if not isinstance(value, dict):
        raise BodyInvalid("the body must be a JSON object")
    return value


def _read_body(request: FireRequest) -> bytes:
    length = (request.content_length or "").strip()
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise WebhookRejected(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {MAX_BODY_BYTES} bytes",
                              reason="body too large (Content-Length)")  # fmt: skip
    raw = request.read_body(MAX_BODY_BYTES + 1)
    if len(raw) > MAX_BODY_BYTES:
        raise WebhookRejected(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {MAX_BODY_BYTES} bytes",
                              reason="body too large")  # fmt: skip
    return raw


# --- signatures ------------------------------------------------------------------------------


def sign(secret: str, msg_id: str, timestamp: int | str, body: bytes) -> str:
    """The ``v1,<base64>`` signature of a message under a ``whsec_`` secret (Standard Webhooks)."""
    key = base64.b64decode(secret.removeprefix(services.SIGNING_SECRET_PREFIX))
    digest = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def _verify_signature(trigger: Trigger, request: FireRequest, raw: bytes, now: float) -> str:
    """The verified ``webhook-id``; raises WebhookRejected otherwise."""

    def refuse(message: str) -> WebhookRejected:
        return WebhookRejected(401, "INVALID_SIGNATURE", message, reason=f"signature: {message}")

    secret = services.trigger_signing_secret(trigger)
    if not secret:
        raise refuse("this trigger requires signed requests but has no signing secret yet")
    msg_id = request.headers.get("webhook-id") or ""
    timestamp = request.headers.get("webhook-timestamp") or ""
    signatures = request.headers.get("webhook-signature") or ""
    if not msg_id or not timestamp or not signatures:
        raise refuse("webhook-id, webhook-timestamp and webhook-signature headers are required")
    if len(msg_id) > MAX_IDEMPOTENCY_KEY_CHARS or len(signatures) > MAX_SIGNATURE_HEADER_CHARS:
        raise refuse("signature headers are too long")
    if not timestamp.isascii() or not timestamp.isdigit() or len(timestamp) > 12:
        raise refuse("webhook-timestamp must be Unix seconds")
    if abs(now - int(timestamp)) > SIGNATURE_TOLERANCE_SECONDS:
        raise refuse("webhook-timestamp is outside the 5-minute tolerance")
    try:
        expected = sign(secret, msg_id, timestamp, raw).encode()
    except (binascii.Error, ValueError):
        raise refuse("the signing secret is unusable; rotate it") from None
    for candidate in signatures.split(" "):
        if candidate.startswith("v1,") and hmac.compare_digest(candidate.encode(), expected):
            return msg_id
    raise refuse("no signature matches")


# --- firing ------------------------------------------------------------------------------------


def _idempotency_key(request: FireRequest, body: dict[str, Any], webhook_id: str | None) -> str | None:
    """The dedupe key: a verified ``webhook-id`` always; else the header, else the body's key.

    The ``webhook-id`` is covered by the signature, an ``Idempotency-Key`` header is not:
    a captured signed request replayed with a key added, removed or changed must
    still be the same delivery.
    """
    if webhook_id is not None:
        return webhook_id
    key: Any = request.headers.get("Idempotency-Key")
    if key is None and "idempotency_key" in body:
        key = body["idempotency_key"]
        if not isinstance(key, str):
            raise BodyInvalid("idempotency_key must be a string")
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise BodyInvalid(f"an idempotency key has 1 to {MAX_IDEMPOTENCY_KEY_CHARS} characters")
    return key


def _inputs(trigger: Trigger, body: dict[str, Any]) -> dict[str, Any]:
    mapping = trigger.config.get("input_mapping")
    if mapping:
        return map_inputs(mapping, body)
    return {k: v for k, v in body.items() if k != "idempotency_key"}


def _audit_rejection(request: FireRequest, trigger: Trigger | None, rejection: WebhookRejected,
                     token: str | None) -> None:  # fmt: skip
    addressed = _addressed(request)
    if trigger is not None and trigger.automation_id != addressed:
        trigger = None  # another workspace's trigger is none of this chain's business
    if trigger is not None:
        workspace_id = trigger.workspace_id
    else:  # audit in the chain of the automation that was addressed, when there is one
        automations = Automation.objects.filter(pk=addressed) if addressed else Automation.objects.none()
        workspace_id = automations.values_list("workspace_id", flat=True).first()
    rejections.rejection_audit(
        automation_ref=str(addressed) if workspace_id is not None else rejections.UNKNOWN_AUTOMATION,
        workspace_id=workspace_id, actor=f"webhook:{request.remote_addr or 'unknown'}",
        summary=f"webhook fire rejected ({rejection.http_status}): {rejection.reason}"[:500],
        refs={"automation": request.automation_id[:64], "trigger": str(trigger.pk) if trigger else ""},
        payload={"status": rejection.http_status, "code": rejection.code, "reason": rejection.reason,
                 "remote_addr": request.remote_addr, "errors": rejection.errors or []},
        secrets=[token] if token else [],
    )  # fmt: skip


def _too_many_failures(retry_after: int, reason: str) -> WebhookRejected:
    return WebhookRejected(429, "TOO_MANY_FAILURES", "too many failed authentications; retry later",
                           reason=reason, headers={"Retry-After": str(retry_after)})  # fmt: skip


def webhook_fire(request: FireRequest, *, now: datetime | None = None) -> DispatchResult:
    """Authenticate, check and dispatch one fire; raises WebhookRejected (already audited)."""
    address = request.remote_addr or "unknown"
    trigger: Trigger | None = None
    token: str | None = None
    try:
        # The token is checked first: a valid one is never refused by an address block (behind a
        # proxy, or a NAT, one address is many senders). The block bounds what the failures of a
        # blocked address cost (no counting, no ledger row past the quota), not the odds of
        # guessing a 256-bit token.
        trigger, reason, token = _authenticate(request)
        if reason == ARCHIVED:  # the token is right: its holder may know the automation is gone
            raise WebhookRejected(410, "GONE", "the automation is archived", reason=ARCHIVED)
        if trigger is None and (blocked := rejections.address_blocked(address)) is not None:
            raise _too_many_failures(
                blocked, f"{reason}; client address blocked after failed authentications"
            )
        if trigger is None:
            addressed = _addressed(request)
            limited = rejections.auth_failed(address, str(addressed) if addressed else "-")
            if limited is not None:
                raise _too_many_failures(limited, f"{reason}; past the failed-authentication limit")
            raise WebhookRejected(401, "UNAUTHENTICATED", "invalid or missing token", reason=reason,
                                  headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
        return _fire(trigger, request, now or timezone.now())
    except WebhookRejected as rejection:
        with transaction.atomic():
            _audit_rejection(request, trigger, rejection, token)
        instruments.webhook_rejected(code=rejection.code)
        raise


def _fire(trigger: Trigger, request: FireRequest, now: datetime) -> DispatchResult:
    config = trigger.config
    limit = int(config.get("rate_limit_per_minute") or DEFAULT_RATE_LIMIT_PER_MINUTE)
    # The count goes to Redis now and its answer is read once the body is checked: a refusal
    # for the body (415, 413, 401 signature, 400, 422) still comes after a 429, as it did.
    rate_limited = rate_limit_start(trigger, limit, now.timestamp())
    try:
        checked = _checked_body(trigger, request, now)
    except WebhookRejected:
        _refuse_if_limited(rate_limited(), limit)
        raise
    except BaseException:
        rate_limited()  # read the answer all the same: the connection is the thread's
        raise
    _refuse_if_limited(rate_limited(), limit)
    body, inputs, dedupe = checked

    try:
        return dispatch(
            DispatchRequest(
                automation_id=trigger.automation_id, inputs=inputs, trigger_type="webhook",
                trigger_key=trigger.key, trigger_id=trigger.pk, trigger_payload=body,
                triggered_by=f"webhook:{trigger.key}", dedupe=dedupe,
                last_fired_at=trigger.last_fired_at or trigger.created_at,
                principal_ids=webhook_principals(trigger), automation=trigger.automation,
                touch=(Trigger, trigger.pk, {"last_fired_at": now}),
            )
        )  # fmt: skip
    except DispatchError as exc:
        raise WebhookRejected(exc.http_status, exc.code, exc.message, reason=f"dispatch: {exc.code}",
                              errors=exc.errors) from None  # fmt: skip


def _refuse_if_limited(retry_after: int | None, limit: int) -> None:
    if retry_after is not None:
        raise WebhookRejected(429, "RATE_LIMITED", f"more than {limit} fires a minute for this trigger",
                              reason="rate limited", headers={"Retry-After": str(retry_after)})  # fmt: skip


def _checked_body(
    trigger: Trigger, request: FireRequest, now: datetime
) -> tuple[dict[str, Any], dict[str, Any], Dedupe | None]:
    """The body, the run's inputs and the dedupe key: checks 3 to 7 of the module's list."""
    config = trigger.config
    if not _is_json(request.headers.get("Content-Type")):
        raise WebhookRejected(415, "UNSUPPORTED_MEDIA_TYPE", "the body must be application/json",
                              reason="content type not JSON")  # fmt: skip
    if (request.headers.get("Content-Encoding") or "identity").strip().lower() != "identity":
        raise WebhookRejected(415, "UNSUPPORTED_MEDIA_TYPE", "no content encoding is supported (send plain JSON)",
                              reason="content encoded")  # fmt: skip
    raw = _read_body(request)
    webhook_id = (
        _verify_signature(trigger, request, raw, now.timestamp()) if config.get("require_signature") else None
    )
    try:
        body = parse_body(raw)
        key = _idempotency_key(request, body, webhook_id)
    except BodyInvalid as exc:
        raise WebhookRejected(400, "INVALID_ARGUMENT", str(exc), reason=f"invalid body: {exc}") from None
    try:
        inputs = _inputs(trigger, body)
    except MappingError as exc:
        raise WebhookRejected(422, "UNPROCESSABLE", f"the trigger's {exc}",
                              reason=f"input mapping: {exc}") from None  # fmt: skip
    dedupe = Dedupe(scope=f"trigger:{trigger.pk}", key=key, request_hash=request_hash(body)) if key else None
    return body, inputs, dedupe
