"""a2wsgi's WSGI-in-ASGI adapter, with fewer hand-offs between the event loop and the WSGI thread.

a2wsgi hands every ASGI message between the WSGI thread and the event loop one
by one, each a ``run_coroutine_threadsafe`` round (a self-pipe write, a loop
wake-up, a thread wake-up): each read of the request body, the response's
start, its body, the empty last body; and it runs a sender task with a queue
for every request. Here:

- **The whole request body is read on the event loop before the thread is
  called**, under one absolute deadline (``body_timeout``, the setting
  ``AUTOPLANE_BODY_READ_TIMEOUT_SECONDS``): the thread finds it buffered and never
  waits for the client or the loop. A client that sends its body slowly holds a
  socket and a coroutine meanwhile, never one of the few WSGI threads, and no
  longer than the deadline (then 408). A body larger than ``body_limit``
  (``DATA_UPLOAD_MAX_MEMORY_SIZE``) is refused with 413 before any of it is read
  when its ``Content-Length`` says so, or as soon as a chunked body passes it. A
  client that waits for ``100 Continue`` gets it from the loop (gunicorn sends it
  on the first ``receive()``), unless its ``Content-Length`` is refused first.
- **A whole response needs no hand-off of its own.** A Django response that is
  not streaming is complete when the app returns, so its start and its whole
  body are the WSGI call's result: the event loop, woken anyway when the
  thread's call completes, sends them itself, with no sender task, no queue and
  no thread waiting for the loop. Streaming responses (static files, anything
  with ``streaming = True`` or that is not a Django response) start a2wsgi's
  sender and go chunk by chunk.

So a fire is two cross-thread wake-ups: the loop handing the request to a
thread, and the thread's call completing.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
from typing import Any

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import Body, WSGIResponder, build_environ

# DATA_UPLOAD_MAX_MEMORY_SIZE's default and a bound well above any honest client's upload time.
DEFAULT_BODY_LIMIT = 2_621_440
DEFAULT_BODY_TIMEOUT = 20.0


class _BodyRefused(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class _ClientGone(Exception):
    """The client disconnected (or gunicorn gave up waiting for a chunk) before the body ended."""


def _framing(scope) -> tuple[int | None, bool]:
    """The declared ``Content-Length`` (None when absent or unreadable) and whether the body is chunked."""
    length: int | None = None
    chunked = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            text = value.strip()
            length = int(text) if text.isdigit() else None
        elif name == b"transfer-encoding":
            chunked = True
    return length, chunked


class _Body(Body):
    async def read_whole(self, limit: int | None) -> None:
        """Receive the whole body on the event loop; refuse it once it passes ``limit`` bytes."""
        while self._has_more:
            message: dict[str, Any] = dict(await self.receive())  # an ASGI message (a TypedDict)
            if message.get("type") != "http.request":
                raise _ClientGone
            self._has_more = bool(message.get("more_body", False))
            self.buffer.extend(message.get("body", b""))
            if limit is not None and len(self.buffer) > limit:
                raise _BodyRefused(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {limit} bytes")


async def _refuse(send, refused: _BodyRefused) -> None:
    # The body is left unread, so the connection cannot carry another request: gunicorn closes it
    # (it keeps a connection alive only after a completely framed body); say so.
    body = json.dumps({"error": {"code": refused.code, "message": refused.message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]  # fmt: skip
    await send({"type": "http.response.start", "status": refused.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def read_body(scope, receive, body: _Body, *, limit: int | None, timeout: float) -> None:
    """Read the request's whole body into ``body`` before any thread is taken, or raise
    :class:`_BodyRefused` (413 past ``limit``, 408 past ``timeout`` seconds) / :class:`_ClientGone`."""
    length, chunked = _framing(scope)
    if length is not None and limit is not None and length > limit:  # before a 100 Continue
        raise _BodyRefused(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {limit} bytes")
    if not chunked and not length:
        return
    try:
        async with asyncio.timeout(timeout):
            await body.read_whole(limit)
    except TimeoutError:
        raise _BodyRefused(
            408, "REQUEST_TIMEOUT", f"the body did not arrive within {timeout:g} seconds"
        ) from None


class _Responder(WSGIResponder):
    _held: list[Any] | None = None
    _send: Any = None
    _sender: asyncio.Task | None = None

    def send(self, message) -> None:
        if self._held is not None:
            self._held.append(message)  # start_response's start (or a write()), sent with the body
            return
        super().send(message)

    async def _stream(self, messages: list[Any]) -> None:
        # On the loop: the response turned out to stream; start a2wsgi's sender with what is held.
        self._sender = self.loop.create_task(self.sender(self._send))
        for message in messages:
            await self.send_queue.put(message)

    def _flush(self, messages: list[Any]) -> None:
        asyncio.run_coroutine_threadsafe(self._stream(messages), loop=self.loop).result()

    body_limit: int | None = DEFAULT_BODY_LIMIT
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    async def __call__(self, scope, receive, send) -> None:
        # a2wsgi's WSGIResponder.__call__, but the body comes read and a whole response comes back
        # as the call's result.
        body = _Body(self.loop, receive)
        try:
            await read_body(scope, receive, body, limit=self.body_limit, timeout=self.body_timeout)
        except _BodyRefused as refused:
            await _refuse(send, refused)
            return
        except _ClientGone:
            return  # nobody is left to answer (or gunicorn closes the stalled connection itself)
        environ = build_environ(scope, body)
        self._send = send
        try:
            call = functools.partial(contextvars.copy_context().run, self.wsgi, environ, self.start_response)
            whole = await self.loop.run_in_executor(self.executor, call)
            if whole is None:  # streamed: the sender has it
                await self.send_queue.put(None)
                assert self._sender is not None
                await self._sender  # it may raise
            else:
                for message in whole:
                    await send(message)
            if self.exc_info is not None:
                raise self.exc_info[0].with_traceback(self.exc_info[1], self.exc_info[2])
        finally:
            if self._sender is not None and not self._sender.done():
                self._sender.cancel()

    def wsgi(self, environ, start_response) -> list[Any] | None:  # type: ignore[override]
        """The whole response's messages (start, one final body); None when it was streamed."""
        self._held = []
        iterable = self.app(environ, start_response)
        try:
            held, self._held = self._held, None
            if getattr(iterable, "streaming", True):
                self._flush(held)
                for chunk in iterable:
                    self.send({"type": "http.response.body", "body": chunk, "more_body": True})
                self.send({"type": "http.response.body", "body": b""})
                return None
            return [*held, {"type": "http.response.body", "body": b"".join(iterable)}]
        finally:
            self._held = None
            getattr(iterable, "close", lambda: None)()


class WholeResponseWSGIMiddleware(WSGIMiddleware):
    def __init__(self, app, workers: int = 10, send_queue_size: int = 10, *,
                 body_limit: int | None = DEFAULT_BODY_LIMIT, body_timeout: float = DEFAULT_BODY_TIMEOUT) -> None:  # fmt: skip
        super().__init__(app, workers=workers, send_queue_size=send_queue_size)
        self.body_limit = body_limit
        self.body_timeout = body_timeout

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            responder = _Responder(self.app, self.executor, self.send_queue_size)
            responder.body_limit, responder.body_timeout = self.body_limit, self.body_timeout
            return await responder(scope, receive, send)
        return await super().__call__(scope, receive, send)
