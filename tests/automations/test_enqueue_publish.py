"""The execute message of a run asks for no result: the run row is its result (issue 11's lean fire path)."""

from __future__ import annotations

import base64
import json
import socket
import uuid

import pytest
from celery import signals

from automations.enqueue import EXECUTE_TASK, publish_run
from config.celery import app


def test_an_execute_message_asks_for_no_result_and_the_sender_subscribes_to_none():
    queue, run_id = f"test-publish-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    sent: list[dict] = []

    def capture(sender=None, headers=None, **kwargs):
        if sender == EXECUTE_TASK and headers and headers.get("argsrepr", "").find(run_id) >= 0:
            sent.append(headers)

    signals.before_task_publish.connect(capture, weak=False)
    try:
        publish_run(run_id, queue)
    finally:
        signals.before_task_publish.disconnect(capture)
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(queue)

    assert len(sent) == 1
    assert sent[0]["ignore_result"] is True
    consumer = getattr(app.backend, "result_consumer", None)  # the Redis result backend's pub/sub
    if consumer is not None:
        assert sent[0]["id"] not in {
            channel.decode() if isinstance(channel, bytes) else channel for channel in consumer.subscribed_to
        }


# --- the direct Redis publish (config.redis_publish) ------------------------------------------------

redis_lane = pytest.mark.skipif(
    not str(app.conf.broker_url).startswith("redis://"), reason="the direct publish is the Redis broker's"
)


def _pop(queue: str) -> str:
    import redis

    client = redis.Redis.from_url(app.conf.broker_url)
    try:
        raw = client.rpop(queue)
        assert client.llen(queue) == 0
    finally:
        client.delete(queue, f"_kombu.binding.{queue}")
    assert raw is not None
    return raw.decode()


@redis_lane
def test_the_direct_publish_pushes_the_bytes_send_task_pushes():
    from config import redis_publish

    queue, run_id, task_id = f"test-publish-{uuid.uuid4().hex[:8]}", str(uuid.uuid4()), str(uuid.uuid4())
    app.send_task(EXECUTE_TASK, args=[run_id], queue=queue, ignore_result=True, task_id=task_id)
    sent = _pop(queue)
    delivery_tag = json.loads(sent)["properties"]["delivery_tag"]  # kombu's random uuid4

    assert redis_publish.message(EXECUTE_TASK, [run_id], queue, task_id, delivery_tag) == sent


@redis_lane
def test_publish_run_pushes_one_execute_message_directly_and_sends_no_signal():
    from config import redis_publish

    queue, run_id = f"test-publish-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    assert redis_publish.usable()
    calls: list[tuple] = []
    original = redis_publish.publish

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis_publish, "publish", counted)
        patch.setattr(app, "send_task", lambda *args, **kwargs: pytest.fail("published by send_task"))
        publish_run(run_id, queue)

    message = json.loads(_pop(queue))
    assert calls == [(EXECUTE_TASK, [run_id], queue)]
    assert message["headers"]["task"] == EXECUTE_TASK
    assert message["headers"]["ignore_result"] is True
    assert json.loads(base64.b64decode(message["body"]))[0] == [run_id]
    assert message["properties"]["delivery_info"] == {"exchange": "", "routing_key": queue}


@redis_lane
def test_with_a_publish_signal_receiver_or_a_countdown_the_message_goes_by_send_task(monkeypatch):
    from config import redis_publish

    monkeypatch.setattr(redis_publish, "publish", lambda *args, **kwargs: pytest.fail("published directly"))
    sent: list = []
    monkeypatch.setattr(app, "send_task", lambda name, **options: sent.append(options))

    def receiver(**kwargs):  # e.g. OpenTelemetry's Celery instrumentation: its headers must ride along
        pass

    signals.before_task_publish.connect(receiver, weak=False)
    try:
        assert not redis_publish.usable()
        publish_run(str(uuid.uuid4()), "automations_fast")
    finally:
        signals.before_task_publish.disconnect(receiver)
    publish_run(str(uuid.uuid4()), "automations_fast", countdown=3.0)

    assert [options.get("countdown") for options in sent] == [None, 3.0]


@redis_lane
@pytest.mark.django_db(transaction=True)
def test_a_direct_publish_to_a_broker_that_is_down_leaves_the_run_accepted_for_the_relay(
    workspace, api, monkeypatch, caplog
):
    from automations import services
    from automations.models import Run, RunStatus
    from tests.factories import definition, transform

    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    from config import redis_direct

    real = redis_direct.connection
    monkeypatch.setattr(
        redis_direct, "connection", lambda url, timeout: real(f"redis://127.0.0.1:{port}/0", 1)
    )
    automation = services.automation_create(
        workspace=workspace, definition=definition(plan=[transform("a", "x")])
    )

    response = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")

    assert response.status_code == 202, response.content
    assert Run.objects.get(pk=response.json()["run_id"]).status == RunStatus.QUEUED
    assert "committed but not published" in caplog.text


@redis_lane
def test_the_direct_publish_reuses_the_thread_connection_and_survives_the_server_closing_it():
    import redis

    from config import redis_direct

    queue, url = f"test-publish-{uuid.uuid4().hex[:8]}", app.conf.broker_url
    client = redis.Redis.from_url(url)
    try:
        publish_run(str(uuid.uuid4()), queue)
        first = redis_direct.connection(url, 1.0)
        publish_run(str(uuid.uuid4()), queue)
        assert redis_direct.connection(url, 1.0) is first
        host, port = first._sock.getsockname()[:2]
        client.client_kill(f"{host}:{port}")  # a broker restart, as the connection sees it
        publish_run(str(uuid.uuid4()), queue)

        assert client.llen(queue) == 3
    finally:
        client.delete(queue, f"_kombu.binding.{queue}")


@redis_lane
def test_a_push_that_redis_refuses_is_reported_when_its_reply_is_read_before_the_next_publish(caplog):
    # The fire is answered without waiting for the LPUSH's reply (the run is committed either
    # way); a refused push is logged for the relay when the thread publishes next.
    import redis

    queue, other, url = (
        f"test-publish-{uuid.uuid4().hex[:8]}",
        f"test-publish-{uuid.uuid4().hex[:8]}",
        app.conf.broker_url,
    )
    refused, accepted = str(uuid.uuid4()), str(uuid.uuid4())
    client = redis.Redis.from_url(url)
    client.set(queue, "not a list")  # LPUSH answers WRONGTYPE
    try:
        publish_run(refused, queue)
        assert "committed but not published" not in caplog.text
        publish_run(accepted, other)

        assert f"run {refused} committed but not published" in caplog.text
        assert accepted not in caplog.text
        assert client.llen(other) == 1
    finally:
        client.delete(queue, other, f"_kombu.binding.{other}")
