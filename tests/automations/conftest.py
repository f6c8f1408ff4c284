"""Fixtures for engine tests: a workspace with an owner, a teammate and an outsider,
API clients for each, a local HTTP server that records side effects, and a
driver that runs the real executor in-process (the Celery task is a thin wrapper
around the same call)."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from automations import executor
from automations.models import Run, RunStatus
from workspaces.services import workspace_get_or_create


@pytest.fixture
def workspace(db):
    ws = workspace_get_or_create(slug="acme")
    ws.egress_allowlist = ["127.0.0.1"]
    ws.save(update_fields=["egress_allowlist"])
    return ws


@pytest.fixture
def other_workspace(db):
    return workspace_get_or_create(slug="globex")


@pytest.fixture
def drive():
    """Run a run to rest with the real executor, letting parked timers come due at once."""

    def _drive(run_id, max_rounds: int = 50) -> Run:
        for _ in range(max_rounds):
            run = Run.objects.get(pk=run_id)
            if run.status == RunStatus.WAITING:
                Run.objects.filter(pk=run_id).update(wake_at=timezone.now() - timedelta(seconds=1))
            elif run.status == RunStatus.RUNNING:
                if run.lease_expires_at is None or run.lease_expires_at > timezone.now():
                    return run
            elif run.status != RunStatus.QUEUED or run.enqueued_at is None:
                return run
            executor.execute_run(str(run_id))
        raise AssertionError(f"run {run_id} did not come to rest")

    return _drive


class Recorder(BaseHTTPRequestHandler):
    """Answers with the status the test set and records every request it sees."""

    def _handle(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        server = self.server
        with server.lock:
            server.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "headers": dict(self.headers),
                    "body": body.decode(),
                }
            )
            status = server.statuses.pop(0) if server.statuses else 200
        if server.block is not None:
            server.block.wait(30)
        payload = json.dumps({"ok": status < 400, "path": self.path, "seen": len(server.requests)}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _handle

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.requests, server.statuses, server.block, server.lock = [], [], None, threading.Lock()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
