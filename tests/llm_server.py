"""A local OpenAI-compatible chat-completions server that replays a script.

Started by a test on 127.0.0.1 (a free port), it answers each
``POST /v1/chat/completions`` with the next scripted reply, over real HTTP,
and keeps every request it received so tests can assert on what was sent::

    server.script(reply_text('{"summary": "ok", "flags": []}'))
    server.script(reply_tool_call("core.echo", {"x": 1}), Reply(429, {"error": "slow down"}))
    ...
    server.requests[0]["messages"]

A request with nothing left in the script gets HTTP 500 and is recorded in
``unexpected`` (the test fails on it at teardown). A reply with a ``delay``
is held that long before it is sent (a slow model; ``arrived`` is set when a
request came in, ``stop()`` lets held replies go).
"""

from __future__ import annotations

import json
import threading
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypedDict, Unpack


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict → JSON; bytes → sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0  # seconds the answer is held (a slow model)


class TokenCounts(TypedDict, total=False):
    prompt_tokens: int
    completion_tokens: int


def completion(message: dict[str, Any], *, prompt_tokens: int = 100, completion_tokens: int = 20,
               finish_reason: str = "stop") -> Reply:  # fmt: skip
    return Reply(body={
        "id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })  # fmt: skip


def reply_text(text: str, **usage: Unpack[TokenCounts]) -> Reply:
    return completion({"content": text}, **usage)


def reply_json(value: Any, **usage: Unpack[TokenCounts]) -> Reply:
    return reply_text(json.dumps(value), **usage)


def reply_tool_call(
    name: str, arguments: Any, *, call_id: str = "call_1", **usage: Unpack[TokenCounts]
) -> Reply:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    return completion({"content": None, "tool_calls": [call]}, finish_reason="tool_calls", **usage)


class ScriptedLlmServer:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.unexpected: list[str] = []
        self._lock = threading.Lock()
        self.arrived = threading.Event()
        self.release = threading.Event()
        self.answered = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                with server._lock:
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    try:
                        server.requests.append(json.loads(raw))
                    except ValueError:
                        server.requests.append({"_unparsed": raw.decode("utf-8", "replace")})
                    if self.path != "/v1/chat/completions" or not server.replies:
                        server.unexpected.append(self.path)
                        reply = Reply(500, {"error": {"message": "nothing scripted"}})
                    else:
                        reply = server.replies.popleft()
                server.arrived.set()
                if reply.delay:
                    server.release.wait(reply.delay)
                body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the caller abandoned the call
                    return
                with server._lock:
                    server.answered += 1

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> ScriptedLlmServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def script(self, *replies: Reply) -> None:
        self.replies.extend(replies)

    def sent_text(self) -> str:
        """Everything every request carried, as one string (for "was X ever sent" assertions)."""
        return json.dumps(self.requests)
