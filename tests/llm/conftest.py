"""Fixtures for the LLM features: a workspace with an owner, an operator, a viewer
and an outsider, and a scripted OpenAI-compatible server on 127.0.0.1 that the
platform is configured to use (``llm``), or no LLM at all (``no_llm``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from cryptography.fernet import Fernet

from tests.llm_server import ScriptedLlmServer

# USD per million tokens for the scripted model: 100 prompt + 20 completion tokens
# (the server's default usage) cost 0.001 + 0.001 = 0.002 per call.
PRICE_IN, PRICE_OUT = Decimal("10"), Decimal("50")


@pytest.fixture
def llm(settings):
    server = ScriptedLlmServer().start()
    settings.LLM_BASE_URL = server.base_url
    settings.LLM_MODEL = "scripted-model"
    settings.LLM_API_KEY = "sk-test-llm-key"
    settings.LLM_RETRY_BASE_SECONDS = 0.01
    settings.LLM_TIMEOUT_SECONDS = 10.0
    settings.LLM_PRICES = {"scripted-model": (PRICE_IN, PRICE_OUT)}
    yield server
    server.stop()
    assert not server.unexpected, f"requests nobody scripted: {server.unexpected}"
    assert not server.replies, f"scripted replies never requested: {len(server.replies)}"


@pytest.fixture
def no_llm(settings):
    settings.LLM_BASE_URL = ""
    settings.LLM_MODEL = ""
    settings.LLM_API_KEY = ""


@pytest.fixture(autouse=True)
def credential_key(settings) -> None:
    """Credentials in these tests are encrypted under a key of the test's own."""
    settings.AUTOPLANE_CREDENTIAL_KEYS = [Fernet.generate_key().decode()]


# The engine tests' recorder: a local HTTP server that counts the requests it gets.
from tests.automations.conftest import http_server  # noqa: E402, F401
