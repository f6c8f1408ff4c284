"""ops.wsgi_adapter: a whole Django response crosses from the WSGI thread to the event loop at once.

The served app (``ops.wsgi``) is driven through the adapter on a real event loop,
as gunicorn's ``asgi`` worker drives it; the answers must be those of Django's
own WSGI handling, streaming ones (static files) chunk by chunk as before.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import django.contrib.admin
from django.test import Client

from ops.wsgi import application as wsgi_application
from ops.wsgi_adapter import WholeResponseWSGIMiddleware


def _scope(method: str, path: str, headers: list | None = None) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"localhost"), *(headers or [])], "client": ("127.0.0.1", 5000),
            "server": ("127.0.0.1", 8000)}  # fmt: skip


def _serve(
    method: str, path: str, body: bytes | list[bytes] = b"", headers: list | None = None, *,
    wsgi_app=wsgi_application, workers: int = 2, **options,
) -> list[dict]:  # fmt: skip
    app = WholeResponseWSGIMiddleware(wsgi_app, workers=workers, **options)
    scope = _scope(method, path, headers)
    sent: list[dict] = []
    chunks = list(body) if isinstance(body, list) else [body]

    async def receive() -> dict:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

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


def _no_hand_off(monkeypatch):
    from a2wsgi import wsgi as a2wsgi_wsgi

    from ops import wsgi_adapter

    def no_hand_off(*args, **kwargs):
        raise AssertionError("the WSGI thread handed something to the event loop")

    monkeypatch.setattr(wsgi_adapter._Responder, "_flush", no_hand_off)
    monkeypatch.setattr(a2wsgi_wsgi.WSGIResponder, "send", no_hand_off)
    monkeypatch.setattr(a2wsgi_wsgi.asyncio, "run_coroutine_threadsafe", no_hand_off)


def test_a_request_body_is_read_on_the_event_loop_before_the_thread_runs(monkeypatch):
    _no_hand_off(monkeypatch)
    body = b'{"name": "' + b"x" * 5000 + b'"}'

    # the body arrives in three pieces, as a client's packets would
    sent = _serve("POST", "/api/v1/no-such-thing", [body[:7], body[7:4000], body[4000:]],
                  [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())])  # fmt: skip

    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 404


def _serve_echo(chunks: list[bytes], headers: list) -> list[dict]:
    from django.http import HttpResponse

    def app(environ, start_response):  # a Django response, so it goes back whole
        response = HttpResponse(str(len(environ["wsgi.input"].read())).encode())
        start_response("200 OK", list(response.items()))
        return response

    return _serve("POST", "/", chunks, headers, wsgi_app=app, workers=1)


def test_a_large_body_is_read_whole_on_the_event_loop_before_the_thread_runs(monkeypatch):
    _no_hand_off(monkeypatch)
    piece = b"y" * 100_000
    chunks = [piece] * 12  # 1.2 MB: past the old 256 KB prefetch, below the 2.5 MB cap
    total = sum(map(len, chunks))

    sent = _serve_echo(chunks, [(b"content-length", str(total).encode())])

    assert sent[-1]["body"] == str(total).encode()


def test_a_chunked_body_and_one_expecting_100_continue_are_read_whole_on_the_loop(monkeypatch):
    # gunicorn sends the 100 Continue on the first receive(): here, the event loop's
    _no_hand_off(monkeypatch)
    assert _serve_echo([b"ab", b"cd", b"e"], [(b"transfer-encoding", b"chunked")])[-1]["body"] == b"5"
    expecting = [(b"content-length", b"3"), (b"expect", b"100-continue")]
    assert _serve_echo([b"a", b"b", b"c"], expecting)[-1]["body"] == b"3"


def _refused(sent: list[dict]) -> tuple[int, dict, dict]:
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    return sent[0]["status"], dict(sent[0]["headers"]), json.loads(sent[1]["body"])


def _never_called(*args, **kwargs):
    raise AssertionError("the WSGI app ran")


def test_a_declared_length_past_the_cap_is_413_before_any_byte_is_read_or_a_100_continue_sent():
    received: list[int] = []
    app = WholeResponseWSGIMiddleware(_never_called, workers=1, body_limit=1000)
    scope = _scope(
        "POST", "/api/v1/automations", [(b"content-length", b"1001"), (b"expect", b"100-continue")]
    )
    sent: list[dict] = []

    async def receive():
        received.append(1)  # gunicorn would send the 100 Continue here
        return {"type": "http.request", "body": b"x" * 1001, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    app.executor.shutdown()

    status, headers, body = _refused(sent)
    assert (status, body["error"]["code"], received) == (413, "PAYLOAD_TOO_LARGE", [])
    assert headers[b"connection"] == b"close"


def test_a_chunked_body_past_the_cap_is_413_as_soon_as_it_passes():
    pieces = [b"x" * 600, b"x" * 600, b"x" * 600]
    sent = _serve("POST", "/", pieces, [(b"transfer-encoding", b"chunked")], wsgi_app=_never_called, workers=1,
                  body_limit=1000)  # fmt: skip
    status, _, body = _refused(sent)
    assert (status, body["error"]["code"]) == (413, "PAYLOAD_TOO_LARGE")


def test_a_body_that_does_not_arrive_within_the_deadline_is_408_and_no_thread_ran():
    app = WholeResponseWSGIMiddleware(_never_called, workers=1, body_timeout=0.2)
    scope = _scope("POST", "/api/v1/automations", [(b"content-length", b"100")])
    sent: list[dict] = []
    trickle = [b'{"a": "', b"b", b"c"]

    async def receive():  # a few bytes, then the client stalls for good
        if trickle:
            return {"type": "http.request", "body": trickle.pop(0), "more_body": True}
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    app.executor.shutdown()

    status, headers, body = _refused(sent)
    assert (status, body["error"]["code"]) == (408, "REQUEST_TIMEOUT")
    assert headers[b"connection"] == b"close"


def test_a_client_gone_mid_body_runs_no_thread_and_gets_no_answer():
    pieces = [b"ab"]

    app = WholeResponseWSGIMiddleware(_never_called, workers=1)
    sent: list[dict] = []

    async def receive():
        if pieces:
            return {"type": "http.request", "body": pieces.pop(), "more_body": True}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(app(_scope("POST", "/", [(b"content-length", b"10")]), receive, send))
    app.executor.shutdown()
    assert sent == []
