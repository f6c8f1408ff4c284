"""Event triggers end to end (SPEC §6.3): publish → deliver → match → run, chains and cycles.

Delivery is driven in-process with ``events.deliver(event_id)`` (what the
``autoplane.deliver_event`` task calls) and runs with the real executor.
"""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from automations import events, services
from automations.dispatcher import MAX_CHAIN_DEPTH
from automations.expressions.filter_grammar import CompiledFilter
from automations.models import DomainEvent, Run, RunStatus
from config.celery import app as celery_app
from tests.factories import definition, event
from triggers import matching
from triggers.models import Trigger


@pytest.fixture
def deliver(db):
    """Deliver every event published since the last call (each once), in order; returns their ids."""
    delivered: set[str] = set()

    def _deliver() -> list[str]:
        ids = [str(pk) for pk in DomainEvent.objects.order_by("created_at").values_list("pk", flat=True)]
        fresh = [pk for pk in ids if pk not in delivered]
        for pk in fresh:
            events.deliver(pk)
            delivered.add(pk)
        return fresh

    return _deliver


def _runs_of(automation) -> list[Run]:
    return list(Run.objects.filter(automation=automation).order_by("created_at"))


def _settle(drive, deliver, rounds: int = 40) -> None:
    """Run queued runs and deliver their events until nothing moves."""
    for _ in range(rounds):
        queued = list(Run.objects.filter(status=RunStatus.QUEUED).values_list("pk", flat=True))
        for run_id in queued:
            drive(run_id)
        if not deliver() and not queued:
            return
    raise AssertionError("the chain did not settle")


def test_a_published_event_runs_the_matching_trigger_only(db, api, make_automation, deliver, drive):
    csv = make_automation(definition(name="csv", triggers=[event(
        event_type="files.added", input_mapping={"name": "$.payload.name"},
        filter={"$and": [{"path": "payload.size", "gt": 0}, {"path": "payload.name", "ends_with": ".csv"}]},
    )]))  # fmt: skip
    pdf = make_automation(definition(name="pdf", triggers=[event(
        event_type="files.added", filter={"path": "payload.name", "ends_with": ".pdf"})]))  # fmt: skip
    other_type = make_automation(definition(name="other", triggers=[event(event_type="files.removed")]))

    response = api.post("/api/v1/events", {"event_type": "files.added", "payload": {"name": "q3.csv", "size": 10}},
                        format="json")  # fmt: skip
    assert response.status_code == 202
    deliver()

    (run,) = _runs_of(csv)
    assert not _runs_of(pdf)
    assert not _runs_of(other_type)
    assert (run.trigger_type, run.trigger_key) == ("event", "on-event")
    assert run.inputs == {"name": "q3.csv"}
    assert run.trigger_payload["payload"] == {"name": "q3.csv", "size": 10}
    assert run.trigger_payload["id"] == response.json()["event_id"]
    assert drive(run.pk).status == RunStatus.SUCCEEDED


def test_a_redelivered_event_starts_no_second_run(db, make_automation, workspace):
    automation = make_automation(definition(triggers=[event()]))
    event_id = events.publish(workspace_id=workspace.id, event_type="files.added", payload={}, source="test")

    events.deliver(event_id)
    events.deliver(event_id)

    assert len(_runs_of(automation)) == 1


def test_events_of_another_workspace_do_not_match(db, make_automation, other_workspace):
    automation = make_automation(definition(triggers=[event()]))
    event_id = events.publish(
        workspace_id=other_workspace.id, event_type="files.added", payload={}, source="test"
    )

    events.deliver(event_id)

    assert not _runs_of(automation)


def test_paused_or_disabled_event_triggers_do_not_match(db, make_automation, workspace, owner):
    paused = make_automation(definition(name="paused", triggers=[event()]))
    services.automation_update(automation=paused, status="paused", user=owner)
    disabled = make_automation(definition(name="disabled", triggers=[{**event(), "enabled": False}]))

    events.deliver(
        events.publish(workspace_id=workspace.id, event_type="files.added", payload={}, source="t")
    )

    assert not Run.objects.filter(automation__in=[paused, disabled]).exists()


def test_an_edited_filter_applies_to_the_next_event(db, make_automation, workspace, owner):
    automation = make_automation(definition(triggers=[event(filter={"path": "payload.n", "equals": 1})]))
    publish = lambda n: events.deliver(  # noqa: E731
        events.publish(workspace_id=workspace.id, event_type="files.added", payload={"n": n}, source="t")
    )
    publish(2)
    assert not _runs_of(automation)

    services.automation_update(automation=automation, user=owner,
                               definition=definition(triggers=[event(filter={"path": "payload.n", "equals": 2})]))  # fmt: skip
    publish(2)

    assert len(_runs_of(automation)) == 1


def test_a_filter_over_its_time_budget_is_audited_and_starts_nothing(
    db, make_automation, workspace, monkeypatch
):
    automation = make_automation(definition(triggers=[event(filter={"path": "payload.n", "gt": 0})]))
    original = CompiledFilter.matches
    monkeypatch.setattr(CompiledFilter, "matches", lambda self, doc: original(self, doc, budget_seconds=-1.0))
    matching._cache.clear()

    events.deliver(
        events.publish(workspace_id=workspace.id, event_type="files.added", payload={"n": 1}, source="t")
    )

    assert not _runs_of(automation)
    assert AuditEvent.objects.filter(type="event.filter_budget_exceeded").count() == 1


def test_one_automations_success_runs_another_on_the_same_trace(db, make_automation, api, deliver, drive):
    a = make_automation(definition(name="A"))
    b = make_automation(definition(name="B", triggers=[event(
        event_type="automation.run.succeeded", filter={"path": "payload.automation_id", "equals": str(a.pk)},
        input_mapping={"upstream": "$.payload.run_id"},
    )]))  # fmt: skip
    bystander = make_automation(definition(name="C", triggers=[event(
        event_type="automation.run.succeeded", filter={"path": "payload.automation_id", "equals": "nobody"})]))  # fmt: skip
    first = services.run_create(automation=a, inputs={}).run

    _settle(drive, deliver)

    (downstream,) = _runs_of(b)
    assert not _runs_of(bystander)
    assert downstream.status == RunStatus.SUCCEEDED
    assert downstream.trace_id == first.trace_id
    assert downstream.parent_run_id == first.pk
    assert downstream.chain_depth == 1
    assert downstream.inputs == {"upstream": str(first.pk)}


def test_a_cycle_stops_at_the_chain_depth_bound_and_the_trace_tells_the_story(db, make_automation, api, deliver,
                                                                              drive, owner):  # fmt: skip
    a = make_automation(definition(name="A"))
    b = make_automation(definition(name="B", triggers=[event(
        event_type="automation.run.succeeded", filter={"path": "payload.automation_id", "equals": str(a.pk)})]))  # fmt: skip
    services.automation_update(automation=a, user=owner, definition=definition(name="A", triggers=[event(
        event_type="automation.run.succeeded", filter={"path": "payload.automation_id", "equals": str(b.pk)})]))  # fmt: skip
    first = services.run_create(automation=a, inputs={}).run

    _settle(drive, deliver)

    runs = list(Run.objects.order_by("chain_depth"))
    assert [run.chain_depth for run in runs] == list(range(MAX_CHAIN_DEPTH))
    assert [run.automation_id for run in runs] == [a.pk, b.pk] * (MAX_CHAIN_DEPTH // 2)
    assert {run.trace_id for run in runs} == {first.trace_id}
    assert all(run.status == RunStatus.SUCCEEDED for run in runs)
    stopped = AuditEvent.objects.get(type="event.chain_depth_exceeded")
    assert stopped.trace_id == first.trace_id
    assert stopped.payload["chain_depth"] == MAX_CHAIN_DEPTH

    types = [item["type"] for item in _audit_trace(api, first.trace_id)]
    assert types.count("run.created") == MAX_CHAIN_DEPTH
    assert types.count("run.succeeded") == MAX_CHAIN_DEPTH
    assert types[-1] == "event.chain_depth_exceeded"


def _audit_trace(api, trace_id: str) -> list[dict]:
    """Every page of ``GET /api/v1/audit?trace_id=``."""
    items, url, params = [], "/api/v1/audit", {"trace_id": trace_id}
    while url:
        response = api.get(url, params)
        assert response.status_code == 200
        body = response.json()
        items += body["results"]
        url, params = body["next"], None
    return items


def test_subscribers_are_looked_up_by_workspace_and_event_type(db, make_automation, workspace):
    subscribed = make_automation(definition(name="sub", triggers=[event(event_type="orders.paid")]))
    for i in range(5):
        make_automation(definition(name=f"noise-{i}", triggers=[event(key=f"k{i}", event_type=f"noise.{i}")]))
    published = events.Event(id="e1", workspace_id=workspace.id, event_type="orders.paid", source="t", payload={},
                              trace_id="t" * 32, chain_depth=0, parent_run_id=None)  # fmt: skip

    found = matching.subscribers(published)

    assert [t.automation_id for t in found] == [subscribed.pk]
    assert Trigger.objects.get(automation=subscribed).event_type == "orders.paid"


# --- delivery at least once, matching once, publishing repeatable ----------------------------------


def test_matching_the_same_event_twice_starts_one_run_per_trigger(db, make_automation, workspace):
    first = make_automation(definition(name="first", triggers=[event()]))
    second = make_automation(definition(name="second", triggers=[event()]))
    event_id = events.publish(workspace_id=workspace.id, event_type="files.added", payload={}, source="test")
    row = DomainEvent.objects.get(pk=event_id)

    # What a redelivery racing the first delivery does: both reach the matcher.
    matching.event_matched(events._as_event(row))
    matching.event_matched(events._as_event(row))

    assert len(_runs_of(first)) == 1
    assert len(_runs_of(second)) == 1


def test_a_delivery_records_itself_and_the_relay_resends_only_undelivered_events(db, make_automation, workspace,
                                                                                   settings):  # fmt: skip
    settings.AUTOPLANE_RELAY_AFTER_SECONDS = 0
    automation = make_automation(definition(triggers=[event()]))
    lost = events.publish(
        workspace_id=workspace.id, event_type="files.added", payload={"n": 1}, source="test"
    )
    delivered = events.publish(
        workspace_id=workspace.id, event_type="files.added", payload={"n": 2}, source="test"
    )
    unwanted = events.publish(workspace_id=workspace.id, event_type="nobody.cares", payload={}, source="test")
    events.deliver(delivered)

    assert DomainEvent.objects.get(pk=delivered).delivered_at is not None
    assert DomainEvent.objects.get(pk=unwanted).delivered_at is not None  # nothing to deliver
    assert DomainEvent.objects.get(pk=lost).delivered_at is None
    before = DomainEvent.objects.get(pk=lost).sent_at

    assert events.redeliver() == 1  # only the lost one
    assert DomainEvent.objects.get(pk=lost).sent_at > before
    events.deliver(lost)  # what the re-sent message does
    events.deliver(lost)  # and a late duplicate of the original

    assert len(_runs_of(automation)) == 2
    assert events.redeliver() == 0


def test_a_publish_whose_delivery_cannot_be_queued_is_still_accepted(
    db, api, make_automation, monkeypatch, django_capture_on_commit_callbacks
):
    make_automation(definition(triggers=[event()]))

    def broker_down(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(celery_app, "send_task", broker_down)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = api.post("/api/v1/events", {"event_type": "files.added", "payload": {}}, format="json")

    assert len(callbacks) == 1  # the delivery was attempted, and failed

    assert response.status_code == 202
    row = DomainEvent.objects.get(pk=response.json()["event_id"])
    assert row.delivered_at is None  # the relay will send it


def test_post_events_with_an_idempotency_key_is_one_event(db, api, make_automation):
    automation = make_automation(definition(triggers=[event()]))
    body = {"event_type": "files.added", "payload": {"name": "a.csv"}}

    first = api.post("/api/v1/events", body, format="json", HTTP_IDEMPOTENCY_KEY="connector-1")
    again = api.post("/api/v1/events", body, format="json", HTTP_IDEMPOTENCY_KEY="connector-1")
    other = api.post("/api/v1/events", {**body, "payload": {"name": "b.csv"}}, format="json",
                     HTTP_IDEMPOTENCY_KEY="connector-1")  # fmt: skip
    unkeyed = api.post("/api/v1/events", body, format="json")

    assert (first.status_code, again.status_code, unkeyed.status_code) == (202, 200, 202)
    assert again.json()["event_id"] == first.json()["event_id"]
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "UNPROCESSABLE"
    assert DomainEvent.objects.count() == 2
    for event_id in DomainEvent.objects.values_list("pk", flat=True):
        events.deliver(str(event_id))
    assert len(_runs_of(automation)) == 2


def test_an_idempotency_key_over_255_characters_is_400(db, api):
    response = api.post("/api/v1/events", {"event_type": "files.added"}, format="json",
                        HTTP_IDEMPOTENCY_KEY="k" * 256)  # fmt: skip

    assert response.status_code == 400
    assert not DomainEvent.objects.exists()
