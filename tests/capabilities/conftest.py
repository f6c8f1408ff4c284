"""Fixtures for credential and MCP tests: a workspace with an admin, a viewer and an
outsider (admin of another workspace), token-authenticated API clients, a fresh
credential key per test, and real MCP servers (the SDK's MCPServer) over
streamable HTTP and stdio."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.fernet import Fernet

SERVER_SCRIPT = Path(__file__).with_name("mcp_test_server.py")


@pytest.fixture(autouse=True)
def credential_key(settings) -> str:
    """Every test encrypts under a key of its own (never the data directory's key file)."""
    key = Fernet.generate_key().decode()
    settings.AUTOPLANE_CREDENTIAL_KEYS = [key]
    return key


# --- real MCP servers -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the MCP test server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"the MCP test server did not listen on {port}")


class HttpMcpServer:
    """The test server in a uvicorn subprocess; ``restart(variant=...)`` serves another variant on the same port."""

    def __init__(self, notes: Path) -> None:
        self.notes = notes
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen | None = None

    def start(self, variant: str = "") -> HttpMcpServer:
        env = {**os.environ, "MCP_TEST_NOTES": str(self.notes), "MCP_TEST_VARIANT": variant}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "--http", str(self.port)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port, self.process)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None

    def restart(self, variant: str = "") -> HttpMcpServer:
        self.stop()
        return self.start(variant)

    def notes_written(self) -> list[str]:
        return self.notes.read_text().splitlines() if self.notes.exists() else []


@pytest.fixture(scope="module")
def _shared_mcp_http(tmp_path_factory) -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(tmp_path_factory.mktemp("mcp") / "notes.txt").start()
    yield server
    server.stop()


@pytest.fixture
def mcp_http(_shared_mcp_http) -> HttpMcpServer:
    """The module's HTTP MCP server (default variant), with no notes written yet. Do not stop or restart it."""
    if _shared_mcp_http.process is None or _shared_mcp_http.process.poll() is not None:
        _shared_mcp_http.start()
    _shared_mcp_http.notes.unlink(missing_ok=True)
    return _shared_mcp_http


@pytest.fixture
def own_mcp_http(tmp_path) -> Iterator[HttpMcpServer]:
    """An HTTP MCP server of the test's own, free to stop or restart with another variant."""
    server = HttpMcpServer(tmp_path / "notes.txt").start()
    yield server
    server.stop()


@pytest.fixture
def stdio_command() -> list[str]:
    return [sys.executable, str(SERVER_SCRIPT), "--stdio"]
