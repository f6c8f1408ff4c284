"""A worker that loses the Redis broker while holding an unacked message survives it (issue 18).

Celery's reaction to a lost connection (``Connection.collect()``, then ``close()``) detaches the kombu
transport before the channel holding the unacked message is closed; that close, and a late ack,
then need a connection. They must fail as the connection errors kombu and Celery handle, not as the
AttributeError that killed the worker ("Unrecoverable error"). The real Redis broker of the lane."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.conf import settings
from kombu import Connection, Exchange, Queue

import config.celery  # noqa: F401  (registers config.redis_broker as kombu's redis transport)
from config import redis_broker

pytestmark = pytest.mark.skipif(
    not settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://")), reason="the Redis broker's lane"
)


def test_an_unacked_message_survives_its_detached_channel_closing():
    name = f"broker-loss-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name), routing_key=name)
    with Connection(settings.CELERY_BROKER_URL) as conn:
        conn.Producer().publish({"n": 1}, exchange=queue.exchange, routing_key=name, declare=[queue])
        channel = conn.default_channel
        assert isinstance(channel, redis_broker.Channel)
        message = queue(channel).get(no_ack=False)
        assert message is not None
        unacked_key, tag = channel.unacked_key, message.delivery_tag
        errors = conn.connection_errors
        client = channel.client
        assert client.hexists(unacked_key, tag)

        conn._do_close_transport()  # what Connection.collect() ends with, the consumer's channel still open

        conn.close()  # closes the channel: its unacked message cannot be restored now, and that is no crash
        # The task finishing late acks on that channel: logged, not raised.
        message.ack_log_error(logging.getLogger(__name__), errors)

    # The message stays in the broker's unacked set: restored after the visibility timeout.
    try:
        assert client.hexists(unacked_key, tag)
    finally:
        client.hdel(unacked_key, tag)
        client.zrem(channel.unacked_index_key, tag)
        client.delete(name)
