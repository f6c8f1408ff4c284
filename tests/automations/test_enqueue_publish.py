"""The execute message of a run asks for no result: the run row is its result (issue 11's lean fire path)."""

from __future__ import annotations

import uuid

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
