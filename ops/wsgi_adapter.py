"""a2wsgi's WSGI-in-ASGI adapter, with fewer hand-offs between the event loop and the WSGI thread.

a2wsgi hands every ASGI message between the WSGI thread and the event loop one
by one, each a ``run_coroutine_threadsafe`` round (a self-pipe write, a loop
wake-up, a thread wake-up): each read of the request body, the response's
start, its body, the empty last body; and it runs a sender task with a queue
for every request. Here:

- **The request body is read on the event loop before the thread is called**,
  up to :data:`PREFETCH_BYTES` (a webhook's body, an API write): the thread
  finds it buffered and never waits for the loop. A larger body's rest, and the
  body of a request that expects ``100 Continue``, are read by the thread as before. A client that sends its body slowly holds a socket
  and a coroutine meanwhile, not one of the few WSGI threads.
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
from typing import Any

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import Body, WSGIResponder, build_environ

# Read on the event loop before the WSGI thread runs: a webhook's whole body (256 KB) and one byte more.
PREFETCH_BYTES = 256 * 1024 + 1


def _prefetches(scope) -> bool:
    """Whether the request declares a body, and its client does not wait for a ``100 Continue``
    (that one is sent when the app first reads the body, so the app keeps the say over it)."""
    declared = False
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            declared = value.strip() not in (b"", b"0")
        elif name == b"transfer-encoding":
            declared = True
        elif name == b"expect":
            return False
    return declared


class _Body(Body):
    async def prefetch(self, limit: int) -> None:
        """Receive the body on the event loop until it ends or ``limit`` bytes are buffered."""
        while self._has_more and len(self.buffer) < limit:
            message: dict[str, Any] = dict(await self.receive())  # an ASGI message (a TypedDict)
            self._has_more = bool(message.get("more_body", False))
            self.buffer.extend(message.get("body", b""))


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

    async def __call__(self, scope, receive, send) -> None:
        # a2wsgi's WSGIResponder.__call__, but the body comes read and a whole response comes back
        # as the call's result.
        body = _Body(self.loop, receive)
        if _prefetches(scope):
            await body.prefetch(PREFETCH_BYTES)
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
    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            responder = _Responder(self.app, self.executor, self.send_queue_size)
            return await responder(scope, receive, send)
        return await super().__call__(scope, receive, send)
