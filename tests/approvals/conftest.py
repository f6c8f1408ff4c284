"""Shared fixtures for the approvals tests.

* a throwaway Ed25519 signing key per test;
* ``sent``: every Celery message the code under test sends (nothing reaches a broker);
* ``target``: a local HTTP server counting requests per path — the side effect;
* ``_no_deployment_allowlist``: only the workspace's egress allowlist applies.

``people`` and ``drive`` are the suite's own (tests/conftest.py, tests/factories.py).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest


@pytest.fixture(autouse=True)
def signing_key_file(signing_key_file):
    """Every test signs with its own key file (tests/conftest.py's fixture, used by every test here)."""
    return signing_key_file


@pytest.fixture(autouse=True)
def sent(monkeypatch) -> list[tuple[str, list]]:
    """Capture Celery messages: every task is sent by name (``send_task``), the engine's runs included."""
    from config.celery import app

    messages: list[tuple[str, list]] = []
    lock = threading.Lock()

    def send_task(name, args=None, kwargs=None, **options):
        with lock:
            messages.append((name, list(args or [])))

    monkeypatch.setattr(app, "send_task", send_task)
    # The execute message's direct Redis publish (config.redis_publish) goes by send_task here too.
    monkeypatch.setattr("automations.enqueue._redis_publish", lambda: None)
    return messages


class _Counting(BaseHTTPRequestHandler):
    hits: Counter
    lock: threading.Lock

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.lock:
            self.hits[(self.command, self.path)] += 1
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _answer


class Target(SimpleNamespace):
    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def count(self, path: str, method: str | None = None) -> int:
        with self.lock:
            return sum(n for (m, p), n in self.hits.items() if p == path and method in (None, m))


@pytest.fixture(scope="session")
def target() -> Iterator[Target]:
    hits: Counter = Counter()
    lock = threading.Lock()
    handler = type("Handler", (_Counting,), {"hits": hits, "lock": lock})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield Target(base=f"http://127.0.0.1:{server.server_address[1]}", hits=hits, lock=lock)
    server.shutdown()
    server.server_close()


_paths = itertools.count()


@pytest.fixture
def path_for():
    """A fresh URL path per call, so request counts never mix between tests."""
    return lambda name="x": f"/{name}-{next(_paths)}"


@pytest.fixture(autouse=True)
def _loopback_by_deployment(settings) -> None:
    # The local upstream is on loopback: on the egress deny-list, which only the deployment opens.
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]
