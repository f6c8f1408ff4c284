"""The web server as ``up`` starts it holds slow clients without starving anyone else (issues 11, 32).

A slow client may trickle its headers or its body, large or small, and may wait for a
``100 Continue`` first: it holds a socket and a coroutine on the event loop, never one of
the few WSGI threads, and its body has an absolute deadline
(``AUTOPLANE_BODY_READ_TIMEOUT_SECONDS``, then 408) and a size cap (413).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from ops.management.commands.up import build_specs
from tests.live import live_worker_env

SLOW_CLIENTS = 50


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _healthz_seconds(port: int) -> float:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/healthz")
    conn.getresponse().read()  # 200 or 503 (no workers here): either is an answer
    conn.close()
    return time.monotonic() - started


@contextlib.contextmanager
def _web_server(**env: str) -> Iterator[int]:
    """The web server exactly as ``manage.py up`` runs it (2 processes of 4 threads); its port."""
    port = _free_port()
    (web,) = [spec for spec in build_specs(host="127.0.0.1", port=port, concurrency={q: 1 for q in
              ("default", "automations_fast", "automations_medium", "automations_long")}, web_workers=2)
              if spec.name == "web"]  # fmt: skip
    process = subprocess.Popen(web.argv, cwd=web.cwd, env=live_worker_env(**env), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                _healthz_seconds(port)
                break
            except OSError:
                assert process.poll() is None, "the web server exited"
                assert time.monotonic() < deadline, "the web server never answered"
                time.sleep(0.1)
        yield port
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture(scope="module")
def web_port(django_db_setup) -> Iterator[int]:
    with _web_server() as port:
        yield port


def _post_head(length: int, *extra: bytes) -> bytes:
    return (b"POST /api/v1/automations HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n" % length + b"".join(extra) + b"\r\n")  # fmt: skip


# Half a request's headers; whole headers of an API write and half its body (the API reads a
# write's body before authentication); 300 KB of a 1 MB body (past what used to be read on the
# event loop); or headers that ask for a 100 Continue and then a body byte by byte.
SLOW_STARTS = {
    "headers": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",
    "body": _post_head(100) + b'{"a": "',
    "large_body": _post_head(1_000_000) + b'{"a": "' + b"x" * 300_000,
    "expect_continue": _post_head(100, b"Expect: 100-continue\r\n"),
}


def _recv_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def p99(times: list[float]) -> float:
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


@pytest.mark.workers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("slow_part", SLOW_STARTS)
def test_fifty_slow_connections_do_not_delay_healthz(web_port, slow_part):
    # given the web server as `up` runs it, idle
    idle = min(_healthz_seconds(web_port) for _ in range(3))
    slow: list[socket.socket] = []
    try:
        # when 50 clients each send part of a request (its headers, or its body) and then trickle
        for _ in range(SLOW_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", web_port), timeout=5)
            sock.sendall(SLOW_STARTS[slow_part])
            slow.append(sock)
        for sock in slow:
            sock.sendall(b"a")
        # then /healthz still answers promptly, again and again
        times = [_healthz_seconds(web_port) for _ in range(20)]
        for sock in slow:
            sock.sendall(b"b")  # they are still connected, still unfinished
        assert max(times) < 1.0 + idle, (idle, times)
    finally:
        for sock in slow:
            sock.close()


@pytest.mark.workers
@pytest.mark.timeout(120)
def test_a_client_waiting_for_100_continue_gets_it_and_its_answer(web_port):
    with socket.create_connection(("127.0.0.1", web_port), timeout=10) as sock:
        sock.sendall(_post_head(2, b"Expect: 100-continue\r\n"))
        assert sock.recv(25).startswith(b"HTTP/1.1 100 Continue\r\n")
        sock.sendall(b"{}")
        assert sock.recv(12) == b"HTTP/1.1 401"  # the body arrived; the API answered the request


@pytest.mark.workers
@pytest.mark.timeout(120)
def test_a_declared_body_past_the_cap_is_413_at_once_without_100_continue(web_port):
    with socket.create_connection(("127.0.0.1", web_port), timeout=10) as sock:
        sock.sendall(_post_head(50_000_000, b"Expect: 100-continue\r\n"))
        answer = _recv_all(sock)  # and the server closes the connection
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert b"100 Continue" not in answer
    assert b"PAYLOAD_TOO_LARGE" in answer


@pytest.mark.workers
@pytest.mark.timeout(120)
def test_a_chunked_body_past_the_cap_is_413(web_port):
    chunk = b"x" * 1_000_000
    with socket.create_connection(("127.0.0.1", web_port), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/automations HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        with contextlib.suppress(OSError):  # the server may close before the last chunk is sent
            for _ in range(3):
                sock.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        answer = _recv_all(sock)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]


@pytest.mark.workers
@pytest.mark.timeout(120)
@pytest.mark.parametrize("start", ["body", "expect_continue"])
def test_a_body_still_unfinished_at_the_deadline_is_408_and_the_connection_closed(django_db_setup, start):
    with _web_server(AUTOPLANE_BODY_READ_TIMEOUT_SECONDS="1") as port:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            started = time.monotonic()
            sock.sendall(SLOW_STARTS[start])
            sock.sendall(b"a")  # a byte now and then, each within gunicorn's own per-read timeout
            answer = _recv_all(sock)
            waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"REQUEST_TIMEOUT" in answer
    assert 0.9 < waited < 10, waited
