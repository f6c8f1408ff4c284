"""Shared fixtures for the approvals tests.

* a throwaway Ed25519 signing key per test;
* ``sent``: every Celery message the code under test sends (nothing reaches a broker);
* ``target``: a local HTTP server counting requests per path — the side effect;
* ``people``: workspace "ops" (egress allowed to 127.0.0.1) with owen (admin), alice, bob
  and carol (approvers), oscar (operator), vera (viewer); olga administers another workspace;
* ``drive`` (helpers.Driver): create automations and drive runs in-process through the
  real dispatcher and executor (``run_create`` → ``execute_run``; after a decision,
  ``run_resume`` exactly as the ``autoplane.resume_run`` task does, then ``execute_run``);
* ``committed_people`` / ``committed_drive``: the same on committed data (threads, processes).
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest

from audit import signing

from .helpers import Driver


@pytest.fixture(autouse=True)
def signing_key_file(settings, tmp_path):
    """Every test signs with its own key file; nothing touches the real data directory's key."""
    key_file = tmp_path / "keys" / "signing_key.pem"
    settings.AUTOPLANE_SIGNING_KEY = ""
    settings.AUTOPLANE_SIGNING_KEY_FILE = key_file
    settings.AUTOPLANE_RETIRED_PUBLIC_KEY_FILES = []
    signing.generate_key_file(key_file)
    return key_file


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
def _no_deployment_allowlist(settings) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []


def _make_people() -> SimpleNamespace:
    from django.contrib.auth import get_user_model

    from workspaces.models import Workspace
    from workspaces.services import membership_set_role, workspace_get_or_create

    users = get_user_model().objects
    workspace = workspace_get_or_create(slug="ops")
    Workspace.objects.filter(pk=workspace.pk).update(egress_allowlist=["127.0.0.1"])
    workspace.refresh_from_db()
    other = workspace_get_or_create(slug="elsewhere")
    people = SimpleNamespace(workspace=workspace, other_workspace=other)
    for name, role in [("owen", "admin"), ("alice", "approver"), ("bob", "approver"), ("carol", "approver"),
                       ("oscar", "operator"), ("vera", "viewer")]:  # fmt: skip
        user = users.create_user(username=name, password=f"{name}-password")
        membership_set_role(workspace=workspace, user=user, role=role)
        setattr(people, name, user)
    people.olga = users.create_user(username="olga", password="olga-password")  # an outsider to "ops"
    membership_set_role(workspace=other, user=people.olga, role="admin")
    return people


@pytest.fixture
def people(db) -> SimpleNamespace:
    return _make_people()


@pytest.fixture
def drive(people) -> Driver:
    return Driver(people)


# --- committed data (threads, a live server, worker processes) -----------------------------
# The suite-wide tests/conftest.py lets the flush after a transactional test get past the
# audit ledger's append-only guard.


@pytest.fixture
def committed(transactional_db) -> None:
    """Rows are committed, so other threads and processes see them."""


@pytest.fixture
def committed_people(committed) -> SimpleNamespace:
    return _make_people()


@pytest.fixture
def committed_drive(committed_people) -> Driver:
    return Driver(committed_people)
