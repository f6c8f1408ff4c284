"""a2wsgi's WSGI-in-ASGI adapter, with a whole (non-streaming) response handed to the event loop at once.

a2wsgi's responder hands every ASGI message from the WSGI thread to the event
loop one by one, each a ``run_coroutine_threadsafe`` round (a self-pipe write,
a loop wake-up, a thread wake-up): the start, the body, the empty last body.
A Django response that is not streaming is complete when the app returns, so
its start and its whole body are the WSGI call's result: the event loop, woken
anyway when the thread's call completes, queues them itself, with no hand-off
of their own (no self-pipe write, no thread waiting for the loop). Streaming
responses (static files, anything with ``streaming = True`` or that is not a
Django response) keep a2wsgi's chunk-by-chunk path.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from typing import Any

from a2wsgi import WSGIMiddleware
from a2wsgi.wsgi import Body, WSGIResponder, build_environ


class _Responder(WSGIResponder):
    _held: list[Any] | None = None

    def send(self, message) -> None:
        if self._held is not None:
            self._held.append(message)  # start_response's start (or a write()), sent with the body
            return
        super().send(message)

    async def _put_all(self, messages: list[Any]) -> None:
        for message in messages:
            await self.send_queue.put(message)

    def _flush(self, messages: list[Any]) -> None:
        asyncio.run_coroutine_threadsafe(self._put_all(messages), loop=self.loop).result()

    async def __call__(self, scope, receive, send) -> None:
        # a2wsgi's WSGIResponder.__call__, but a whole response comes back as the call's result.
        environ = build_environ(scope, Body(self.loop, receive))
        sender = None
        try:
            sender = self.loop.create_task(self.sender(send))
            call = functools.partial(contextvars.copy_context().run, self.wsgi, environ, self.start_response)
            whole = await self.loop.run_in_executor(self.executor, call)
            for message in whole or ():
                await self.send_queue.put(message)
            await self.send_queue.put(None)
            await sender  # it may raise
            if self.exc_info is not None:
                raise self.exc_info[0].with_traceback(self.exc_info[1], self.exc_info[2])
        finally:
            if sender and not sender.done():
                sender.cancel()

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
