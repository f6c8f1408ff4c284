"""A real MCP server (tests/capabilities/mcp_test_server.py, the SDK's MCPServer) over streamable HTTP,
in a subprocess: ``HttpMcpServer(notes).start()``; the suite's ``mcp_http`` fixture is one per test module."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SERVER_SCRIPT = Path(__file__).parent / "capabilities" / "mcp_test_server.py"


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
