"""Fixtures for engine tests: a workspace with an owner, a teammate and an outsider,
API clients for each, a local HTTP server that records side effects, and a
driver that runs the real executor in-process (the Celery task is a thin wrapper
around the same call)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


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
