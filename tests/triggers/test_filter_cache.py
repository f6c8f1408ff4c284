"""The compiled-filter cache: an unchanged trigger is compiled once, a changed one again, and
more triggers than the cache's starting size never make it recompile everything."""

from __future__ import annotations

import uuid

import pytest

from automations import events
from tests.factories import definition, event
from triggers import matching
from triggers.models import Trigger

pytestmark = pytest.mark.django_db


@pytest.fixture
def compilations(monkeypatch):
    calls = []
    original = matching.compile_filter

    def counting(spec):
        calls.append(spec)
        return original(spec)

    monkeypatch.setattr(matching, "compile_filter", counting)
    monkeypatch.setattr(matching, "_cache", {})
    monkeypatch.setattr(matching, "_cache_limit", matching.MAX_CACHED_FILTERS)
    return calls


def _triggers(make_automation, n: int, n_filter: int = 5) -> list[Trigger]:
    automation = make_automation(definition(triggers=[
        event(key=f"t{i}", filter={"path": "payload.n", "equals": n_filter + i}) for i in range(n)
    ]))  # fmt: skip
    return list(Trigger.objects.filter(automation=automation).order_by("key"))


def _deliver(workspace, n: int) -> None:
    events.deliver(
        events.publish(workspace_id=workspace.id, event_type="files.added", payload={"n": n}, source="t")
    )


def test_an_unchanged_trigger_is_compiled_once_and_a_changed_one_again(
    make_automation, workspace, compilations
):
    (trigger,) = _triggers(make_automation, 1)
    for _ in range(3):
        _deliver(workspace, 0)
    assert len(compilations) == 1
    trigger.config = {**trigger.config, "filter": {"path": "payload.n", "equals": 99}}
    trigger.config_hash = uuid.uuid4().hex
    trigger.save(update_fields=["config", "config_hash"])
    _deliver(workspace, 0)
    _deliver(workspace, 0)
    assert compilations[1:] == [{"path": "payload.n", "equals": 99}]


def test_more_live_triggers_than_the_starting_size_are_each_compiled_once(
    make_automation, workspace, compilations, monkeypatch
):
    monkeypatch.setattr(matching, "MAX_CACHED_FILTERS", 3)
    monkeypatch.setattr(matching, "_cache_limit", 3)
    _triggers(make_automation, 8)
    for _ in range(4):
        _deliver(workspace, 0)  # matches none of them
    assert len(compilations) == 8


def test_deleted_triggers_are_forgotten_when_the_cache_is_full(
    make_automation, workspace, compilations, monkeypatch
):
    monkeypatch.setattr(matching, "MAX_CACHED_FILTERS", 2)
    monkeypatch.setattr(matching, "_cache_limit", 2)
    gone = [uuid.uuid4(), uuid.uuid4()]
    for trigger_id in gone:
        matching.compiled_filter(trigger_id, "h", {"path": "payload.n", "equals": 1})
    live = _triggers(make_automation, 1)
    _deliver(workspace, 0)
    assert set(matching._cache) == {live[0].pk}
