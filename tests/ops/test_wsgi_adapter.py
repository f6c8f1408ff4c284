"""ops.wsgi_adapter: a whole Django response crosses from the WSGI thread to the event loop at once.

The served app (``ops.wsgi``) is driven through the adapter on a real event loop,
as gunicorn's ``asgi`` worker drives it; the answers must be those of Django's
own WSGI handling, streaming ones (static files) chunk by chunk as before.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import django.contrib.admin
from django.test import Client

from ops.wsgi import application as wsgi_application
from ops.wsgi_adapter import WholeResponseWSGIMiddleware


def _serve(method: str, path: str, body: bytes = b"", headers: list | None = None) -> list[dict]:
    app = WholeResponseWSGIMiddleware(wsgi_application, workers=2)  # type: ignore[arg-type]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
             "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"localhost"), *(headers or [])], "client": ("127.0.0.1", 5000),
             "server": ("127.0.0.1", 8000)}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    app.executor.shutdown()
    return sent


def test_a_whole_response_is_one_start_and_one_final_body_identical_to_django():
    sent = _serve("POST", "/api/v1/no-such-thing", b"{}", [(b"content-type", b"application/json")])
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert not sent[1].get("more_body", False)
    expected = Client().post("/api/v1/no-such-thing", b"{}", content_type="application/json")
    assert sent[0]["status"] == expected.status_code == 404
    assert sent[1]["body"] == expected.content
    assert [name for name, _ in sent[0]["headers"]] == [name.lower().encode() for name in expected.headers]


def test_a_streaming_response_still_goes_chunk_by_chunk():
    css = Path(django.contrib.admin.__file__).parent / "static" / "admin" / "css" / "base.css"
    sent = _serve("GET", "/static/admin/css/base.css")
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    bodies = sent[1:]
    assert len(bodies) > 2  # FileResponse's blocks, then the empty last one
    assert all(m["more_body"] for m in bodies[:-1])
    assert not bodies[-1].get("more_body", False)
    assert b"".join(m["body"] for m in bodies) == css.read_bytes()


def test_a_whole_response_is_queued_by_the_event_loop_without_a_hand_off_from_the_thread(monkeypatch):
    from a2wsgi.wsgi import WSGIResponder

    from ops import wsgi_adapter

    def no_hand_off(*args, **kwargs):
        raise AssertionError("the WSGI thread handed a message to the event loop")

    monkeypatch.setattr(wsgi_adapter._Responder, "_flush", no_hand_off)
    monkeypatch.setattr(WSGIResponder, "send", no_hand_off)

    sent = _serve("GET", "/api/v1/no-such-thing")

    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 404
