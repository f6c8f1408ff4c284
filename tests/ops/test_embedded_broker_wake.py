"""The embedded broker's worker waits less than its polling interval when there is work.

kombu's virtual transports sleep the whole polling interval after a poll that found
nothing, including a poll that found nothing because the worker's prefetch was full.
config.embedded_broker.Transport ends that wait when a message is acknowledged (a pool
process is free) or when the broker file changed (a message was published). Each test sets
a polling interval of 3 s, so kombu's sleep would take seconds where the wake-up takes
milliseconds; the bounds are generous (1 s) for a loaded machine.
"""

from __future__ import annotations

import threading
import time

import pytest
from kombu import Connection, Exchange, Queue

from config.embedded_broker import Transport, _sqlite_path

POLL = 3.0
BOUND = 1.0


@pytest.fixture
def broker(tmp_path, monkeypatch):
    monkeypatch.setattr(Transport, "polling_interval", POLL)
    monkeypatch.setattr(Transport, "idle_after", 60.0)
    url = f"sqla+sqlite:///{tmp_path / 'broker.sqlite3'}"
    queue = Queue("wake", Exchange("wake"), routing_key="wake")
    consumer_conn, publisher_conn = Connection(url), Connection(url)
    yield consumer_conn, publisher_conn, queue
    consumer_conn.release()
    publisher_conn.release()


def _publish(conn: Connection, queue: Queue, body: str) -> None:
    with conn.Producer() as producer:
        producer.publish(body, exchange=queue.exchange, routing_key="wake", declare=[queue])


def test_a_message_published_while_the_worker_waits_is_taken_at_once(broker):
    consumer_conn, publisher_conn, queue = broker
    assert isinstance(consumer_conn.transport, Transport)
    received: list[tuple[str, float]] = []
    with consumer_conn.Consumer(queue, callbacks=[lambda body, msg: (received.append((body, time.monotonic())),
                                                                     msg.ack())]):  # fmt: skip
        with pytest.raises(TimeoutError):
            consumer_conn.drain_events(timeout=0.2)  # nothing there: the worker is now waiting
        timer = threading.Timer(0.3, _publish, (publisher_conn, queue, "one"))
        published = time.monotonic() + 0.3
        timer.start()
        consumer_conn.drain_events(timeout=POLL + 5)
        timer.join()

    assert [body for body, _ in received] == ["one"]
    assert received[0][1] - published < BOUND, "the worker slept through kombu's polling interval"


def test_the_bell_is_heard_when_the_connection_drained_before_it_consumed(broker):
    """The bell follows the queues consumed at each wait, not those of the connection's first drain."""
    consumer_conn, publisher_conn, queue = broker
    with pytest.raises(TimeoutError):
        consumer_conn.drain_events(timeout=0.1)  # no consumer yet: no queue, no bell
    received: list[float] = []
    with consumer_conn.Consumer(
        queue, callbacks=[lambda body, msg: (received.append(time.monotonic()), msg.ack())]
    ):
        with pytest.raises(TimeoutError):
            consumer_conn.drain_events(timeout=0.2)
        timer = threading.Timer(0.3, _publish, (publisher_conn, queue, "one"))
        published = time.monotonic() + 0.3
        timer.start()
        consumer_conn.drain_events(timeout=POLL + 5)
        timer.join()

    assert len(received) == 1
    assert received[0] - published < BOUND, "the worker slept through kombu's polling interval"


def test_a_full_prefetch_takes_the_next_message_as_soon_as_one_is_acknowledged(broker):
    consumer_conn, publisher_conn, queue = broker
    _publish(publisher_conn, queue, "first")
    _publish(publisher_conn, queue, "second")
    held: list = []
    received: list[tuple[str, float]] = []

    def on_message(body, message):
        received.append((body, time.monotonic()))
        held.append(message)

    with consumer_conn.Consumer(queue, callbacks=[on_message]) as consumer:
        consumer.qos(prefetch_count=1)  # as a worker process with acks_late and a prefetch multiplier of 1
        consumer_conn.drain_events(timeout=5)
        assert [body for body, _ in received] == ["first"]
        acked = time.monotonic() + 0.3
        timer = threading.Timer(0.3, held[0].ack)  # the pool process finishing, in another thread
        timer.start()
        consumer_conn.drain_events(timeout=POLL + 5)
        timer.join()

    assert [body for body, _ in received] == ["first", "second"]
    assert received[1][1] - acked < BOUND, "the worker waited for its next poll, not for the acknowledgement"
    assert received[1][1] - acked > -0.05, "the second message was taken while the first was unacknowledged"


def test_the_doorbell_is_only_for_a_sqlite_file():
    assert _sqlite_path("sqlite:////var/lib/autoplane/broker.sqlite3") == "/var/lib/autoplane/broker.sqlite3"
    assert _sqlite_path("sqlite:///:memory:") is None
    assert _sqlite_path("postgresql://host/db") is None
