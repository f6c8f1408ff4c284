"""The Redis broker's kombu transport: kombu's, with a worker that survives losing the broker.

When a worker loses the broker while it holds unacked messages (execute_run is ``acks_late``),
Celery's ``on_connection_error_after_connected`` first calls ``Connection.collect()``, which
detaches the transport (``transport.client = None``) even though closing the consumer's channel
failed, then ``connection.close()``, which closes that channel again. Its QoS restores the unacked
messages through a new connection pool whose parameters are read from the detached
``transport.client``: ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which
nothing catches, and the worker exits ("Unrecoverable error"); a late ack on that channel does the
same. Seen with Celery 5.7 / kombu 5.7.

This channel raises the connection error it is instead, which kombu and Celery handle: the close
is ignored, the ack is logged, the consumer reconnects, and the messages stay in Redis's unacked
set, restored after the visibility timeout (runs are also covered by their lease, the relay and
the sweep). :mod:`config.celery` registers it as kombu's ``redis`` and ``rediss`` transport by
dotted path, so kombu imports it (and redis-py) on a process's first connection to a Redis
broker only. Test: tests/automations/test_broker_loss.py (fails with kombu's own channel).
"""

from __future__ import annotations

import redis
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    def _get_pool(self, asynchronous=False):
        if self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was lost and closed")
        return super()._get_pool(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel
