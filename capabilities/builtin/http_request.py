"""``http_request``: one HTTP call through the egress guard.

Failure mapping (the part the executor's retry logic depends on):

* nothing was sent (DNS, connect refused, connect timeout) → ``TEMPORARILY_UNAVAILABLE``;
* the request may have reached the server (read/write timeout, dropped
  connection) → ``TEMPORARILY_UNAVAILABLE`` for idempotent methods,
  ``OUTCOME_UNKNOWN`` (not retryable) for POST/PATCH — including any failure
  on a redirect hop after a POST/PATCH was answered;
* HTTP 5xx and 429 → ``TEMPORARILY_UNAVAILABLE``; other 4xx → ``INVALID_ARGUMENT``.
  Retrying a POST after a 5xx relies on the remote honouring the
  ``Idempotency-Key`` header sent with every non-GET request.

Messages name the host and status only; response bodies go to ``data`` and
exception text to ``detail``.
"""

from __future__ import annotations

import base64
import json as jsonlib
import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx

from .. import egress
from ..base import (
    ActionContext,
    ActionDefinition,
    Capability,
    Envelope,
    ErrorCode,
    Risk,
    RiskInputs,
    SideEffect,
    StepFailure,
)

logger = logging.getLogger(__name__)

MAX_REDIRECTS = 5
MAX_RESPONSE_BYTES = 1024 * 1024
DEFAULT_TIMEOUT_SECONDS = 30.0
MAX_TIMEOUT_SECONDS = 120.0
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
IDEMPOTENT_METHODS = READ_METHODS | {"PUT", "DELETE"}
METHODS = ["GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"]
_REDACTED_RESPONSE_HEADERS = frozenset({"set-cookie"})
_CROSS_ORIGIN_STRIPPED = frozenset({"authorization", "cookie", "proxy-authorization"})

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["url"],
    "additionalProperties": False,
    "properties": {
        "method": {"enum": METHODS},
        "url": {"type": "string", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://", "maxLength": 8192},
        "headers": _STRING_MAP,
        "params": _STRING_MAP,
        "json": {},
        "body": {"type": "string"},
        "credential": {"type": "string", "minLength": 1, "maxLength": 200},
        "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_SECONDS},
    },
    "not": {"required": ["json", "body"]},
}


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    headers = config.get("headers")
    if isinstance(headers, Mapping):
        for name in headers:
            if isinstance(name, str) and name.strip().lower() == "host":
                return [(f"/headers/{name}", "header_not_allowed",
                         "a Host header is never sent: the request names the URL's host")]  # fmt: skip
    return []


def describe(config: Mapping[str, Any]) -> Capability:
    method = str(config.get("method", "GET")).upper()
    timeout = config.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)
    duration = float(timeout) if isinstance(timeout, int | float) else MAX_TIMEOUT_SECONDS  # templated
    if method in READ_METHODS:
        return Capability(
            id="http_request",
            side_effects=frozenset({SideEffect.READ}),
            risk=Risk.LOW,
            idempotent=True,
            expected_duration_seconds=duration,
        )
    # Every write is medium here, DELETE too: that DELETE is destructive is the risk
    # policy's rule, which raises it once and says so (approvals.policy). An unknown
    # (templated) method is described as the worst case.
    risk = Risk.MEDIUM if method in METHODS else Risk.HIGH
    return Capability(
        id="http_request",
        side_effects=frozenset({SideEffect.EXTERNAL_WRITE}),
        risk=risk,
        idempotent=method in IDEMPOTENT_METHODS,
        expected_duration_seconds=duration,
    )


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    return perform_request(
        ctx,
        method=str(config.get("method", "GET")),
        url=config["url"],
        headers=config.get("headers") or {},
        params=config.get("params") or {},
        json=config.get("json"),
        has_json="json" in config,
        body=config.get("body"),
        credential=config.get("credential"),
        timeout=float(config.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)),
    )


def perform_request(
    ctx: ActionContext,
    *,
    method: str,
    url: str,
    headers: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    json: Any = None,
    has_json: bool = False,
    body: str | None = None,
    credential: str | None = None,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,
) -> Envelope:
    """Make the request (following redirects by hand, each hop re-checked) and build the envelope."""
    method = method.upper()
    deadline = time.monotonic() + max(0.001, min(timeout, ctx.timeout_seconds))
    url = _with_params(url, params or {})
    first_origin = _origin(egress.parse_url(url))
    _remember_userinfo(ctx, url)
    auth = _credential_headers(ctx, credential, url) if credential else {}
    payload, content_type = _payload(json, has_json, body)

    allowlist = () if ctx.public_egress_only else egress.effective_allowlist(ctx.egress_allowlist)
    with egress.EgressClient(allowlist) as client:
        # A cancel abandons the call in flight: its connection is shut down under it.
        forget = ctx.cancelled.on_set(client.abort)
        try:
            return _follow(ctx, client, method, url, headers, payload, content_type, credential, auth,
                           first_origin, deadline)  # fmt: skip
        finally:
            forget()


def _follow(ctx: ActionContext, client: egress.EgressClient, method: str, url: str,
            headers: Mapping[str, str] | None, payload: bytes | None, content_type: str | None,
            credential: str | None, auth: dict[str, str], first_origin: tuple, deadline: float) -> Envelope:  # fmt: skip
    """Send the request, following redirects by hand (each hop checked by the egress guard)."""
    idempotent = method in IDEMPOTENT_METHODS
    committed = False  # a POST/PATCH has been answered: a failure now must not be retried
    for hop in range(MAX_REDIRECTS + 1):
        if ctx.cancelled.is_set() or ctx.cancel_requested():
            raise StepFailure(ErrorCode.CANCELLED, "the run was cancelled")
        target = egress.parse_url(url)
        same_origin = _origin(target) == first_origin
        hop_headers = _request_headers(ctx, method, headers or {}, same_origin=same_origin)
        if same_origin and credential:  # credentials never follow a redirect to another origin
            # a redirect within the origin may still leave the credential's grant: checked again
            hop_headers.update(auth if hop == 0 else _credential_headers(ctx, credential, str(target)))
        if payload is not None and content_type and not _has(hop_headers, "content-type"):
            hop_headers["Content-Type"] = content_type
        remaining = deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise httpx.ConnectTimeout("deadline reached before the request was sent")
            with client.stream(
                method,
                target,
                headers=hop_headers,
                content=payload,
                timeout=remaining,
            ) as response:
                if not response.has_redirect_location:
                    raw, truncated = _read_capped(response, deadline)
                    return _envelope(response, raw, truncated)
                committed = committed or not idempotent
                url, method, keep_body = _next_hop(response)
                payload = payload if keep_body else None
        except StepFailure as failure:  # the egress guard refused this hop
            raise _after_commit(failure) if committed else failure
        except httpx.HTTPError as exc:
            if ctx.cancelled.is_set():
                raise _abandoned(method, target.host, exc)
            raise _transport_failure(exc, target.host, idempotent=idempotent and not committed)
    raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"more than {MAX_REDIRECTS} redirects from {target.host}")


def _abandoned(method: str, host: str, exc: Exception) -> StepFailure:
    """The run was cancelled during the call: its connection was shut down (see ``perform_request``)."""
    effect = "a read: nothing to undo" if method in READ_METHODS else "whether it took effect is unknown"
    return StepFailure(ErrorCode.CANCELLED, f"the {method} request to {host} was abandoned in flight ({effect})",
                       retryable=False, detail=f"{type(exc).__name__}: {exc}")  # fmt: skip


def _with_params(url: str, params: Mapping[str, str]) -> str:
    """``url`` with ``params`` appended to its query: neither is dropped, the URL's own query
    stays byte for byte (httpx's ``params=`` would replace the whole query)."""
    if not params:
        return url
    target = egress.parse_url(url)
    extra = str(httpx.QueryParams(params))
    query = target.query.decode("ascii")
    return str(target.copy_with(query=f"{query}&{extra}".encode() if query else extra.encode()))


def _payload(json: Any, has_json: bool, body: str | None) -> tuple[bytes | None, str | None]:
    if has_json:
        try:
            encoded = jsonlib.dumps(json, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except ValueError as exc:
            raise StepFailure(ErrorCode.INVALID_ARGUMENT, "json is not valid JSON", detail=str(exc))
        return encoded.encode(), "application/json"
    return (body.encode(), None) if body is not None else (None, None)


def _after_commit(failure: StepFailure) -> StepFailure:
    if not failure.retryable:
        return failure
    return StepFailure(
        ErrorCode.OUTCOME_UNKNOWN,
        "the request was answered with a redirect that could not be followed; whether it took effect is unknown",
        retryable=False,
        detail=failure.detail or failure.message,
    )


def _has(headers: Mapping[str, str], name: str) -> bool:
    return any(key.lower() == name for key in headers)


def _request_headers(
    ctx: ActionContext, method: str, headers: Mapping[str, str], *, same_origin: bool
) -> dict[str, str]:
    # A caller's Host header is never sent: the request goes to the URL's host, named as such
    # (refused at save in a definition; dropped here for templated and agent-chosen headers).
    out = {k: v for k, v in headers.items()
           if k.strip().lower() != "host" and (same_origin or k.lower() not in _CROSS_ORIGIN_STRIPPED)}  # fmt: skip
    # Lets the remote deduplicate a request the executor retries or recovers.
    if method != "GET" and not _has(out, "idempotency-key"):
        out["Idempotency-Key"] = ctx.idempotency_key
    return out


def _origin(url: httpx.URL) -> tuple[str, bytes, int | None]:
    return url.scheme, url.raw_host, url.port


def _remember_userinfo(ctx: ActionContext, url: str) -> None:
    """A password in the URL is credential material: make sure the engine redacts it."""
    parsed = httpx.URL(url)
    if parsed.password:
        ctx.secrets.append(parsed.password)
        ctx.secrets.append(base64.b64encode(f"{parsed.username}:{parsed.password}".encode()).decode())


def _next_hop(response: httpx.Response) -> tuple[str, str, bool]:
    """(url, method, keep_body) for following ``response``'s redirect, as browsers and httpx do."""
    try:
        url = str(response.url.join(response.headers["location"]))
    except httpx.InvalidURL as exc:
        raise StepFailure(
            ErrorCode.INVALID_ARGUMENT, f"invalid redirect location from {response.url.host}", detail=str(exc)
        )
    method = response.request.method
    if response.status_code == 303 and method != "HEAD":
        return url, "GET", False
    if response.status_code in (301, 302) and method == "POST":
        return url, "GET", False
    return url, method, True


def _read_capped(response: httpx.Response, deadline: float) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_RESPONSE_BYTES:
            return b"".join(chunks)[:MAX_RESPONSE_BYTES], True
        if time.monotonic() > deadline:
            raise httpx.ReadTimeout("deadline reached while reading the response", request=response.request)
    return b"".join(chunks), False


def _envelope(response: httpx.Response, raw: bytes, truncated: bool) -> Envelope:
    host = response.url.host
    data = {
        "status": response.status_code,
        "headers": _response_headers(response),
        "body": _decode_body(response, raw, truncated),
        "truncated": truncated,
    }
    status = response.status_code
    if status < 400:
        return Envelope.success(data, summary=f"HTTP {status} from {host}")
    retryable = status >= 500 or status == 429
    code = ErrorCode.TEMPORARILY_UNAVAILABLE if retryable else ErrorCode.INVALID_ARGUMENT
    envelope = Envelope.failure(code, f"HTTP {status} from {host}", retryable=retryable)
    envelope.data = data
    return envelope


def _response_headers(response: httpx.Response) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name in response.headers:
        values = response.headers.get_list(name)
        headers[name] = "[redacted]" if name in _REDACTED_RESPONSE_HEADERS else ", ".join(values)
    return headers


def _decode_body(response: httpx.Response, raw: bytes, truncated: bool) -> Any:
    media_type = response.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    is_json = media_type == "application/json" or media_type.endswith("+json")
    if is_json and raw and not truncated:
        try:
            return jsonlib.loads(raw)
        except ValueError:
            pass
    return raw.decode(response.encoding or "utf-8", errors="replace")


def _transport_failure(exc: httpx.HTTPError, host: str, *, idempotent: bool) -> StepFailure:
    logger.warning("http_request to %s failed: %s: %s", host, type(exc).__name__, exc)
    detail = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, httpx.ConnectError) and "CERTIFICATE_VERIFY_FAILED" in str(exc):
        return StepFailure(
            ErrorCode.INVALID_ARGUMENT, f"TLS certificate verification failed for {host}", detail=detail
        )
    if isinstance(exc, httpx.UnsupportedProtocol | httpx.LocalProtocolError):
        return StepFailure(ErrorCode.INVALID_ARGUMENT, f"could not send the request to {host}", detail=detail)
    not_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    if not_sent or idempotent:
        message = f"could not connect to {host}" if not_sent else f"request to {host} failed or timed out"
        return StepFailure(ErrorCode.TEMPORARILY_UNAVAILABLE, message, retryable=True, detail=detail)
    return StepFailure(
        ErrorCode.OUTCOME_UNKNOWN,
        f"request to {host} failed after it was sent; whether it took effect is unknown",
        retryable=False,
        detail=detail,
    )


def _credential_headers(ctx: ActionContext, name: str, url: str) -> dict[str, str]:
    """The headers that send credential ``name`` to ``url``; POLICY_VIOLATION outside its grant."""
    if ctx.resolve_credential is None:
        raise StepFailure(ErrorCode.INTERNAL, "credentials cannot be resolved here")
    # checked on the URL as httpx will send it, so the grant and the request agree on the host
    credential = ctx.resolve_credential(name, destination=str(egress.parse_url(url)))
    if credential is None:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"no credential named '{name}'")

    def field(key: str) -> str | None:
        value = credential.get(key) if isinstance(credential, Mapping) else getattr(credential, key, None)
        return str(value) if value not in (None, "") else None

    kind = field("kind")
    if kind in ("bearer", "oauth2") and (token := field("token") or field("access_token")):
        headers, secrets = {"Authorization": f"Bearer {token}"}, [token]
    elif kind == "basic" and (username := field("username")) and (password := field("password")):
        encoded = base64.b64encode(f"{username}:{password}".encode()).decode()
        headers, secrets = {"Authorization": f"Basic {encoded}"}, [password, encoded]
    elif kind == "header" and (header_name := field("header_name")) and (value := field("value")):
        headers, secrets = {header_name: value}, [value]
    else:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"credential '{name}' cannot be used for HTTP requests")
    # The resolver registers the secret values too; the encoded basic form is ours.
    ctx.secrets.extend(s for s in secrets if s not in ctx.secrets)
    return headers


ACTION = ActionDefinition(
    name="http_request",
    description="Make one HTTP request (SSRF-guarded; JSON responses parsed; body capped at 1 MB).",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
    risk_inputs=lambda config: RiskInputs(method=str(config.get("method", "GET")).upper()),
    credential_destination=lambda config: config.get("url"),
    as_tool=True,
    # A model choosing both the URL and a credential could send that credential anywhere.
    tool_hidden_args=("credential",),
)
