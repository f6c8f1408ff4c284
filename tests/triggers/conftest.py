"""Fixtures for trigger tests: a workspace with an owner, an operator, a viewer and an
outsider, API clients, automations built from small definitions, a driver that runs
the real executor in-process, and webhook helpers."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from automations import services
from tests.factories import definition, webhook
from triggers.models import Trigger
from triggers.services import trigger_token_rotate


@pytest.fixture
def make_automation(workspace, owner):
    def _make(definition_body: dict, *, status: str | None = None, in_workspace=None):
        return services.automation_create(
            workspace=in_workspace or workspace, definition=definition_body, user=owner, status=status
        )

    return _make


@pytest.fixture
def hook(make_automation, owner):
    """An automation with one webhook trigger and its token: ``(automation, trigger, token)``."""

    def _hook(**config):
        automation = make_automation(
            definition(name=config.pop("name", "hooked"), triggers=[webhook(**config)])
        )
        trigger = Trigger.objects.get(automation=automation, key="hook")
        return automation, trigger, trigger_token_rotate(trigger=trigger, user=owner)

    return _hook


@pytest.fixture
def no_enqueue(monkeypatch):
    """Keep dispatch from sending execute_run messages to the broker (tests drive runs themselves)."""
    sent = []

    def _record(*args, **kwargs):
        sent.append((args, kwargs))

    monkeypatch.setattr("automations.enqueue.publish_run", _record)
    return sent


@pytest.fixture(autouse=True)
def _forget_blocked_addresses():
    """The failed-auth limiter marks blocked client addresses in the (process-local) cache."""
    yield
    cache.clear()
