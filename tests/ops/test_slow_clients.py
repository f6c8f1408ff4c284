"""The web server as ``up`` starts it holds slow clients without starving anyone else (issue 11)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time

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


# Half a request's headers; or whole headers of an API write and half its body (the API reads
# a write's body before authentication; it is read on the event loop before a WSGI thread is
# taken, ops.wsgi_adapter).
SLOW_STARTS = {
    "headers": b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Slow: ",
    "body": b"POST /api/v1/automations HTTP/1.1\r\n"
    b'Host: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"a": "',
}


@pytest.mark.workers
@pytest.mark.timeout(180)
@pytest.mark.parametrize("slow_part", SLOW_STARTS)
def test_fifty_slowloris_connections_do_not_delay_healthz(transactional_db, slow_part):
    # given the web server exactly as `manage.py up` runs it
    port = _free_port()
    (web,) = [spec for spec in build_specs(host="127.0.0.1", port=port, concurrency={q: 1 for q in
              ("default", "automations_fast", "automations_medium", "automations_long")}, web_workers=2)
              if spec.name == "web"]  # fmt: skip
    process = subprocess.Popen(web.argv, cwd=web.cwd, env=live_worker_env(), start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    slow: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                idle = _healthz_seconds(port)
                break
            except OSError:
                assert process.poll() is None, "the web server exited"
                assert time.monotonic() < deadline, "the web server never answered"
                time.sleep(0.1)
        # when 50 clients each send half a request (its headers, or its body) and then trickle
        for _ in range(SLOW_CLIENTS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            sock.sendall(SLOW_STARTS[slow_part])
            slow.append(sock)
        for sock in slow:
            sock.sendall(b"a")
        # then /healthz still answers promptly, again and again
        times = [_healthz_seconds(port) for _ in range(3)]
        for sock in slow:
            sock.sendall(b"b")  # they are still connected, still unfinished
        assert max(times) < 1.0 + idle, (idle, times)
    finally:
        for sock in slow:
            sock.close()
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
