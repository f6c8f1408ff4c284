"""Fixtures for the MCP server tests: workspace acme (owner, operator, viewer) and
globex (outsider), an automation that succeeds, one whose only step waits for approval,
and API tokens for each person."""

from __future__ import annotations

import pytest

from automations.services import automation_create
from tests.factories import api_token
from tests.llm_server import ScriptedLlmServer

SUCCEEDS = {
    "schema_version": "1.0",
    "name": "greet",
    "inputs": {"schema": {"type": "object", "properties": {"who": {"type": "string"}}, "required": ["who"]}},
    "plan": [
        {
            "step_id": "hello",
            "action": "transform_data",
            "config": {"output": {"greeting": "hi {{ inputs.who }}"}},
        }
    ],
}
# A1: every step asks a human first (SPEC §7.3), so a run parks awaiting approval.
GATED = {
    "schema_version": "1.0",
    "name": "gated",
    "execution": {"autonomy": "A1"},
    "plan": [{"step_id": "careful", "action": "transform_data", "config": {"output": {"done": True}}}],
}


@pytest.fixture
def greet(workspace, owner):
    return automation_create(workspace=workspace, definition=SUCCEEDS, user=owner)


@pytest.fixture
def gated(workspace, owner):
    return automation_create(workspace=workspace, definition=GATED, user=owner)


@pytest.fixture
def hidden(other_workspace, outsider):
    """globex's automation: nobody in acme may see it."""
    return automation_create(workspace=other_workspace, definition={**SUCCEEDS, "name": "secret plan"},
                             user=outsider)  # fmt: skip


@pytest.fixture
def token_of():
    """An ``mcp``-scoped token of the user's: the only kind the MCP server takes."""
    return lambda user: api_token(user, scope="mcp")


@pytest.fixture
def llm(settings):
    """A scripted OpenAI-compatible server the platform drafts with (see tests/llm_server.py)."""
    server = ScriptedLlmServer().start()
    settings.LLM_BASE_URL, settings.LLM_MODEL, settings.LLM_RETRY_BASE_SECONDS = (
        server.base_url,
        "scripted",
        0.01,
    )
    yield server
    server.stop()
    assert not server.unexpected, f"requests nobody scripted: {server.unexpected}"
