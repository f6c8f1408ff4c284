"""Real deliveries for the notification tests: a local SMTP server (aiosmtpd) and a local webhook
receiver (http.server) that can answer 200, answer 500, or hang.

* ``smtp``: an SMTP server on a free port; ``smtp.messages`` are the e-mails it was handed, and the
  test's Django settings send through it (the real SMTP backend, not locmem);
* ``receiver``: ``receiver.url(path)``; ``receiver.behave(path, "ok" | "fail" | "hang" | "fail_once")``;
  ``receiver.requests(path)`` (method, headers, body) as received;
* ``queued``: the delivery ids the code under test sent to Celery (nothing reaches a broker), which
  ``deliver_all()`` then runs in-process, as the ``autoplane.notify_deliver`` task would.
"""

from __future__ import annotations

import email
import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
from aiosmtpd.controller import Controller

from tests.approvals.conftest import path_for, target  # noqa: F401 - the run's own side effect


@pytest.fixture(autouse=True)
def signing_key_file(signing_key_file):
    return signing_key_file


@pytest.fixture(autouse=True)
def _settings(settings) -> None:
    # The local receivers are on loopback: on the platform deny-list, which only the deployment opens
    # (the workspace allowlist, 127.0.0.1, still applies on top).
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]
    settings.AUTOPLANE_PUBLIC_URL = "https://autoplane.example"
    settings.AUTOPLANE_NOTIFY_TIMEOUT_SECONDS = 0.5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Collect:
    def __init__(self) -> None:
        self.messages: list[email.message.Message] = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        with self.lock:
            self.messages.append(email.message_from_bytes(envelope.content))
            self.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 OK"


@pytest.fixture
def smtp(settings) -> Iterator[SimpleNamespace]:
    handler = _Collect()
    controller = Controller(handler, hostname="127.0.0.1", port=_free_port())
    controller.start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST = "127.0.0.1"
    settings.EMAIL_PORT = controller.port
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    settings.EMAIL_TIMEOUT = 2
    try:
        yield SimpleNamespace(handler=handler, messages=handler.messages, envelopes=handler.envelopes,
                              port=controller.port, stop=controller.stop)  # fmt: skip
    finally:
        try:
            controller.stop()
        except (AssertionError, RuntimeError):
            pass


class _Receiver(BaseHTTPRequestHandler):
    state: SimpleNamespace

    def log_message(self, *args: object) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        state = self.state
        with state.lock:
            state.received[self.path].append((self.command, dict(self.headers), body))
            mode = state.modes.get(self.path, "ok")
            if mode == "fail_once":
                state.modes[self.path] = "ok"
        if mode == "hang":
            state.release.wait(5)
            return
        status = 500 if mode in ("fail", "fail_once") else 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def receiver() -> Iterator[SimpleNamespace]:
    state = SimpleNamespace(
        received=defaultdict(list), modes={}, lock=threading.Lock(), release=threading.Event()
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Handler", (_Receiver,), {"state": state}))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def requests(path: str):
        with state.lock:
            return list(state.received[path])

    def behave(path: str, mode: str) -> None:
        with state.lock:
            state.modes[path] = mode

    yield SimpleNamespace(url=lambda path: base + path, requests=requests, behave=behave, base=base)
    state.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def queued(monkeypatch) -> SimpleNamespace:
    """Celery messages the code sends (by name), and running the deliveries among them in-process."""
    from config.celery import app
    from notifications import services

    messages: list[tuple[str, list]] = []
    lock = threading.Lock()

    def send_task(name, args=None, kwargs=None, **options):
        with lock:
            messages.append((name, list(args or [])))

    monkeypatch.setattr(app, "send_task", send_task)
    monkeypatch.setattr("automations.enqueue._redis_publish", lambda: None)

    def deliveries() -> list[str]:
        with lock:
            return [args[0] for name, args in messages if name == services.DELIVER_TASK]

    def deliver_all() -> dict[str, str]:
        with lock:
            ids = [args[0] for name, args in messages if name == services.DELIVER_TASK]
            messages[:] = [m for m in messages if m[0] != services.DELIVER_TASK]
        return {pk: services.delivery_attempt(pk) for pk in ids}

    return SimpleNamespace(messages=messages, deliveries=deliveries, deliver_all=deliver_all)
