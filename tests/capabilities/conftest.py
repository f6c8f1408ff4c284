"""Fixtures for credential and MCP tests: a workspace with an admin, a viewer and an
outsider (admin of another workspace), token-authenticated API clients, a fresh
credential key per test, and real MCP servers (the SDK's MCPServer) over
streamable HTTP and stdio."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from cryptography.fernet import Fernet

from tests.mcp_servers import SERVER_SCRIPT, HttpMcpServer


@pytest.fixture(autouse=True)
def credential_key(settings) -> str:
    """Every test encrypts under a key of its own (never the data directory's key file)."""
    key = Fernet.generate_key().decode()
    settings.AUTOPLANE_CREDENTIAL_KEYS = [key]
    return key


@pytest.fixture
def admin_client(client, django_user_model):
    """A client logged in to the admin as superuser ``root`` (audited as ``user:root``)."""
    staff = django_user_model.objects.create_superuser(
        username="root", password="pw-root", email="root@example.com"
    )
    client.force_login(staff)
    return client


# --- real MCP servers (mcp_http is the suite's: tests/conftest.py) ----------------------


@pytest.fixture
def own_mcp_http(tmp_path) -> Iterator[HttpMcpServer]:
    """An HTTP MCP server of the test's own, free to stop or restart with another variant."""
    server = HttpMcpServer(tmp_path / "notes.txt").start()
    yield server
    server.stop()


@pytest.fixture
def stdio_command() -> list[str]:
    return [sys.executable, str(SERVER_SCRIPT), "--stdio"]
