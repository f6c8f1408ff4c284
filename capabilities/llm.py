"""The one provider interface for every LLM feature (SPEC §10).

It speaks the OpenAI-compatible ``POST {LLM_BASE_URL}/chat/completions`` API
(OpenAI, Ollama, vLLM, llama.cpp server) over httpx — already the platform's
HTTP client — through a thin typed layer rather than the ``openai`` SDK: the
SDK reads whole response bodies (we cap them, a hostile or broken server can
send megabytes), and its retry loop would not know the step's deadline. The
part of the API used here is one endpoint, non-streaming.

Contract:

* :func:`llm_config` is ``None`` unless ``LLM_BASE_URL`` and ``LLM_MODEL`` are
  set (``LLM_API_KEY`` is optional: Ollama and llama.cpp need none); callers
  then answer :class:`LlmNotConfigured` (HTTP 503 ``LLM_NOT_CONFIGURED``).
* :meth:`LlmClient.chat` retries 429 and 5xx answers, connect errors and
  timeouts with exponential backoff (honouring ``Retry-After``), never past
  the caller's deadline, then raises :class:`LlmError`:
  ``TEMPORARILY_UNAVAILABLE`` (retryable) for those, ``INVALID_ARGUMENT``
  for a refused request (other 4xx) or an answer that is not a chat
  completion (not JSON, no choices, over ``LLM_MAX_RESPONSE_BYTES``).
  Messages are safe to show; the provider's text goes to ``detail`` only.
* :func:`cost_usd` turns token usage into dollars with the per-model prices
  of ``LLM_PRICES``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import httpx
from django.conf import settings

from config.errors import ServiceError

from . import egress
from .base import CancelSignal, ErrorCode

logger = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER_SECONDS = 10.0
_TOKENS_PER_PRICE_UNIT = Decimal(1_000_000)


class LlmNotConfigured(ServiceError):
    def __init__(self) -> None:
        super().__init__(
            "LLM_NOT_CONFIGURED",
            "no LLM is configured: set LLM_BASE_URL and LLM_MODEL (and LLM_API_KEY if the server needs one)",
            503,
        )


class LlmError(ServiceError):
    """The provider failed or answered something unusable; ``code`` is an envelope code."""

    def __init__(self, code: str, message: str, *, detail: str = "", retry_after: float | None = None):
        status = 503 if code == ErrorCode.TEMPORARILY_UNAVAILABLE else 502
        headers = {"Retry-After": str(int(retry_after or 5))} if status == 503 else None
        super().__init__(code, message, status, headers=headers)
        self.detail = detail
        self.retryable = code == ErrorCode.TEMPORARILY_UNAVAILABLE


@dataclass(frozen=True)
class Price:
    """USD per million tokens."""

    input: Decimal
    output: Decimal


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    model: str
    api_key: str = field(default="", repr=False)
    timeout_seconds: float = 60.0
    max_retries: int = 2
    max_response_bytes: int = 256 * 1024


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text as the model wrote it; parse and validate before use


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens
        )

    def as_dict(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...]
    usage: Usage
    finish_reason: str
    model: str

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the conversation before answering its tool calls."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


def llm_config() -> LlmConfig | None:
    if not (settings.LLM_BASE_URL and settings.LLM_MODEL):
        return None
    return LlmConfig(
        base_url=settings.LLM_BASE_URL.rstrip("/"),
        model=settings.LLM_MODEL,
        api_key=settings.LLM_API_KEY,
        timeout_seconds=float(settings.LLM_TIMEOUT_SECONDS),
        max_retries=int(settings.LLM_MAX_RETRIES),
        max_response_bytes=int(settings.LLM_MAX_RESPONSE_BYTES),
    )


def require_llm() -> LlmClient:
    """The configured client, or :class:`LlmNotConfigured`."""
    config = llm_config()
    if config is None:
        raise LlmNotConfigured()
    return LlmClient(config)


def price_for(model: str) -> Price:
    """The model's price; ``*`` is the fallback; unpriced models cost nothing."""
    prices = settings.LLM_PRICES
    found = prices.get(model) or prices.get("*")
    return Price(*found) if found else Price(Decimal(0), Decimal(0))


def cost_usd(model: str, usage: Usage) -> Decimal:
    price = price_for(model)
    total = price.input * usage.prompt_tokens + price.output * usage.completion_tokens
    return (total / _TOKENS_PER_PRICE_UNIT).quantize(Decimal("0.000001"))


class LlmClient:
    def __init__(self, config: LlmConfig, *, transport: httpx.BaseTransport | None = None):
        self.config = config
        self._transport = transport
        self._http: httpx.Client | None = None  # connections of its own (interruptible)
        self._cancelled: CancelSignal | None = None

    @property
    def model(self) -> str:
        return self.config.model

    @contextlib.contextmanager
    def interruptible(self, cancelled: CancelSignal) -> Iterator[LlmClient]:
        """This client on connections of its own that ``cancelled`` shuts down (a run's cancel,
        SPEC §7.2): a call in flight then fails at once with ``CANCELLED``, and none is retried."""
        bound = LlmClient(self.config, transport=self._transport)
        bound._cancelled = cancelled
        backend = egress.AbortableBackend()
        if self._transport is None:
            bound._http = httpx.Client(transport=egress.PinnedTransport(backend), follow_redirects=False)
        forget = cancelled.on_set(backend.abort)
        try:
            with bound._http or contextlib.nullcontext():
                yield bound
        finally:
            forget()

    def _abandoned(self, what: str) -> LlmError | None:
        if self._cancelled is None or not self._cancelled.is_set():
            return None
        return LlmError(ErrorCode.CANCELLED, f"the LLM call was {what}: the run was cancelled")

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        max_tokens: int | None = None,
        json_mode: bool = False,
        deadline: float | None = None,
    ) -> Completion:
        """One chat completion. ``deadline`` is a ``time.monotonic()`` value no retry may pass."""
        body: dict[str, Any] = {"model": self.config.model, "messages": list(messages), "stream": False}
        if tools:
            body["tools"] = list(tools)
        if max_tokens:
            body["max_tokens"] = int(max_tokens)
        if json_mode:
            body["response_format"] = {"type": "json_object"}
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        end = time.monotonic() + self.config.timeout_seconds
        if deadline is not None:
            end = min(end, deadline)
        url = f"{self.config.base_url}/chat/completions"
        attempt = 0
        own = self._http is None and self._transport is not None
        client = self._http or (httpx.Client(transport=self._transport) if own else _shared_client())
        with client if own else contextlib.nullcontext():
            while True:
                remaining = end - time.monotonic()
                if remaining <= 0:
                    raise LlmError(ErrorCode.TEMPORARILY_UNAVAILABLE, "the LLM did not answer in time")
                if cancelled := self._abandoned("not sent"):
                    raise cancelled
                try:
                    status, raw, retry_after = self._post(client, url, headers, body, remaining)
                except httpx.TransportError as exc:
                    if cancelled := self._abandoned("abandoned in flight"):
                        raise cancelled from exc
                    status, raw, retry_after = 0, b"", None
                    failure: LlmError | None = LlmError(ErrorCode.TEMPORARILY_UNAVAILABLE, "the LLM server could not be reached",
                                       detail=f"{type(exc).__name__}: {exc}")  # fmt: skip
                else:
                    if cancelled := self._abandoned("abandoned in flight"):  # its answer is not used
                        raise cancelled
                    failure = None if status == 200 else _status_error(status, raw)
                if failure is None:
                    return _parse_completion(raw, self.config.model)
                if not failure.retryable or attempt >= self.config.max_retries:
                    logger.warning("LLM call failed (%s): %s", failure.code, failure.detail[:500])
                    raise failure
                delay = _backoff(attempt, retry_after)
                if time.monotonic() + delay >= end:
                    raise failure
                logger.info("LLM answered %s; retry %d in %.2fs", status or "no answer", attempt + 1, delay)
                # bounded by the deadline above; the provider asked us to wait
                if self._cancelled is not None and self._cancelled.wait(delay):
                    raise LlmError(ErrorCode.CANCELLED, "the LLM call was not retried: the run was cancelled")
                if self._cancelled is None:
                    time.sleep(delay)
                attempt += 1

    def _post(self, client: httpx.Client, url: str, headers: dict[str, str], body: dict[str, Any],
              timeout: float) -> tuple[int, bytes, float | None]:  # fmt: skip
        cap = self.config.max_response_bytes
        with client.stream("POST", url, headers=headers, json=body, timeout=timeout) as response:
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > cap:
                    raise LlmError(ErrorCode.INVALID_ARGUMENT, f"the LLM's answer is larger than {cap} bytes")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks), _retry_after(response.headers.get("retry-after"))


_client_lock = threading.Lock()
_client: httpx.Client | None = None


def _shared_client() -> httpx.Client:
    """One connection pool per process: building a client loads the CA bundle (~100 ms), and
    keep-alive saves a TLS handshake per call. httpx clients are safe to share between threads."""
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(follow_redirects=False, limits=httpx.Limits(max_keepalive_connections=8))
        return _client


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _backoff(attempt: int, retry_after: float | None) -> float:
    if retry_after is not None:
        return min(retry_after, MAX_RETRY_AFTER_SECONDS)
    base = float(settings.LLM_RETRY_BASE_SECONDS)
    return base * (2**attempt) * random.uniform(0.8, 1.2)


def _status_error(status: int, raw: bytes) -> LlmError:
    detail = f"HTTP {status}: {raw[:500].decode('utf-8', 'replace')}"
    if status in RETRY_STATUSES:
        return LlmError(
            ErrorCode.TEMPORARILY_UNAVAILABLE, f"the LLM server answered HTTP {status}", detail=detail
        )
    if status in (401, 403):
        return LlmError(
            ErrorCode.INVALID_ARGUMENT, "the LLM server refused the configured API key", detail=detail
        )
    return LlmError(
        ErrorCode.INVALID_ARGUMENT, f"the LLM server refused the request (HTTP {status})", detail=detail
    )


def _unusable(why: str, raw: bytes) -> LlmError:
    return LlmError(ErrorCode.INVALID_ARGUMENT, f"the LLM's answer was not a usable chat completion: {why}",
                    detail=raw[:500].decode("utf-8", "replace"))  # fmt: skip


def _parse_completion(raw: bytes, model: str) -> Completion:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise _unusable("not JSON", raw)
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _unusable("no choices", raw)
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise _unusable("no message", raw)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _unusable("content is not text", raw)
    calls: list[ToolCall] = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _unusable("a malformed tool call", raw)
        arguments = function.get("arguments") or "{}"
        if not isinstance(arguments, str):  # some servers send an object
            arguments = json.dumps(arguments)
        calls.append(ToolCall(id=str(call.get("id") or f"call_{len(calls)}"), name=function["name"],
                              arguments=arguments))  # fmt: skip
    usage = doc.get("usage") if isinstance(doc.get("usage"), dict) else {}
    return Completion(
        content=content,
        tool_calls=tuple(calls),
        usage=Usage(_count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))),
        finish_reason=str(choices[0].get("finish_reason") or ""),
        model=str(doc.get("model") or model),
    )


def _count(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
