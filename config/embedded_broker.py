"""The embedded broker's kombu transport: kombu's SQLAlchemy transport, polling every
``CELERY_POLLING_INTERVAL`` seconds (settings.EMBEDDED_BROKER_POLLING_INTERVAL) at most,
and sooner when there is something to take (see :meth:`Transport.drain_events`).

The interval cannot be a transport option: kombu hands those to SQLAlchemy's
create_engine(), which rejects the ones it does not know (kombu#2157). So it is a
class attribute of this subclass, which :mod:`config.celery` registers as kombu's
``sqla`` (and ``sqlalchemy``) transport by dotted path. kombu imports this module,
and SQLAlchemy with it, when a process first connects to an ``sqla+`` broker:
settings never load SQLAlchemy, and the Redis and RabbitMQ lanes never do.
"""

from __future__ import annotations

import os
import threading
from time import monotonic

from django.conf import settings
from kombu.transport import sqlalchemy
from kombu.transport.virtual import Empty
from sqlalchemy.exc import IntegrityError, OperationalError


class Channel(sqlalchemy.Channel):
    """kombu's channel, made safe for several processes starting on one fresh broker file.

    kombu creates the tables (``metadata.create_all``) and a queue's ``kombu_queue`` row
    (SELECT, then INSERT) on first use, guarded by a lock that only serialises threads of
    one process. Another process doing the same at the same moment made this one fail:
    ``table ... already exists`` or an IntegrityError on the queue's unique name, which
    kombu does not catch, so the worker died at start. Losing either race is harmless:
    the table or the row is there, made by the winner; this one reads it and goes on.
    """

    def _open(self):
        try:
            return super()._open()
        except OperationalError as exc:
            if "already exists" not in str(exc):
                raise
            return super()._open()  # create_all again: it now sees the winner's tables

    def _get_or_create(self, queue):
        try:
            return super()._get_or_create(queue)
        except IntegrityError:  # another process inserted the same queue first
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()

    def _put(self, queue, payload, **kwargs):  # type: ignore[override]  # kombu's sqlalchemy signature
        super()._put(queue, payload, **kwargs)
        broker_file = _sqlite_path(self.connection.client.hostname or "")
        if broker_file:
            ring(broker_file, queue)

    def basic_ack(self, delivery_tag, multiple=False):
        super().basic_ack(delivery_tag, multiple=multiple)
        self.connection.slot_freed.set()

    def basic_reject(self, delivery_tag, requeue=False):
        super().basic_reject(delivery_tag, requeue=requeue)
        self.connection.slot_freed.set()

    def _restore(self, message) -> None:
        # Marked as Redis and RabbitMQ mark a message given back (a worker died holding it):
        # kombu's virtual transports set a flag the receiving side never reads.
        message.delivery_info["redelivered"] = True
        super()._restore(message)


def _sqlite_path(url: str) -> str | None:
    """The file of a ``sqlite:///path`` URL (kombu's hostname of an ``sqla+sqlite:///`` broker); None otherwise."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///").split("?", 1)[0]
    return path if path and path != ":memory:" else None


def bell_path(broker_file: str, queue: str) -> str:
    """The doorbell file of ``queue``, beside the broker's file."""
    return f"{broker_file}.{''.join(c if c.isalnum() or c in '-_' else '_' for c in queue)}.bell"


def ring(broker_file: str, queue: str) -> None:
    """Tells the workers of ``queue`` a message was published: one byte appended to its bell file.

    A worker looks at the file's size and modification time (``os.stat``: no database
    lock, no query) and polls the broker only when they changed. The file is emptied
    when it reaches 64 KiB (its size changes then too, which is all a worker looks for).
    """
    try:
        fd = os.open(bell_path(broker_file, queue), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    except OSError:
        return  # no bell: the workers find the message at their next poll
    try:
        if os.write(fd, b".") and os.fstat(fd).st_size >= 65536:
            os.ftruncate(fd, 0)
    except OSError:
        pass
    finally:
        os.close(fd)


class _Doorbell:
    """Whether a message was published to one of ``queues`` since the last look (see :func:`ring`)."""

    def __init__(self, broker_file: str, queues):
        self.paths = [bell_path(broker_file, queue) for queue in sorted(queues)]
        self.seen = self._look()

    def _look(self) -> tuple:
        marks: list[tuple[int, int, int] | None] = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                marks.append(None)
            else:
                marks.append((st.st_size, st.st_mtime_ns, st.st_ino))
        return tuple(marks)

    def rang(self) -> bool:
        marks = self._look()
        changed, self.seen = marks != self.seen, marks
        return changed


class Transport(sqlalchemy.Transport):
    """kombu's transport, with a wait between two polls that ends as soon as there is work.

    kombu's virtual transports sleep ``polling_interval`` whenever a poll found nothing,
    and a poll finds nothing as well when the worker may take no more messages (its
    prefetch is full: with ``acks_late`` and a prefetch multiplier of 1, one message per
    pool process). So a pool process that finished a run stayed idle until the sleep
    ended: each of the fast worker's two processes took one run per 50 ms poll, ~40 runs/s
    whatever the machine, and a run fired just after a poll waited the whole 50 ms
    (docs/performance.md). Here the wait ends early:

    * when the prefetch is full, as soon as a message is acknowledged or rejected (a pool
      process is free: an event set by the channel, no polling at all);
    * otherwise, as soon as a message is published to one of its queues (the publisher
      rings that queue's bell file, :func:`ring`; the worker looks at it with ``os.stat``
      every ``EMBEDDED_BROKER_WAKE_INTERVAL``, and after a second without work every
      ``polling_interval`` / 5, so an idle worker wakes ~100 times a second, not ~500).
      A look takes no database lock: polling the broker itself is a ``BEGIN IMMEDIATE``
      write transaction, and four workers doing that every 2 ms would stall the
      publishers. Only a publish to the worker's own queues rings; taking a message
      does not.

    ``polling_interval`` stays the longest wait, so a message the bell does not announce
    (published by an older process, or a broker that is not a SQLite file) is still found
    by kombu's own poll. Message handling is kombu's: the same ``_get`` takes a
    message, acknowledgements and redelivery are unchanged.
    """

    Channel = Channel
    polling_interval = settings.EMBEDDED_BROKER_POLLING_INTERVAL
    wake_interval = settings.EMBEDDED_BROKER_WAKE_INTERVAL
    idle_after = 1.0  # seconds without a message before the doorbell is looked at less often

    def __init__(self, client, **kwargs):
        super().__init__(client, **kwargs)
        self.slot_freed = threading.Event()
        self._broker_file = _sqlite_path(getattr(client, "hostname", None) or "")
        self._doorbell: _Doorbell | None = None
        self._doorbell_queues: frozenset = frozenset()
        self._last_work = monotonic()

    def _bell(self) -> _Doorbell | None:
        """The bell of the queues consumed now (none before a consumer exists, or off a SQLite file)."""
        if self._broker_file is None:
            return None
        queues = frozenset(queue for channel in self.channels for queue in channel._active_queues)
        if not queues:
            return None
        if self._doorbell is None or self._doorbell_queues != queues:
            self._doorbell, self._doorbell_queues = _Doorbell(self._broker_file, queues), queues
        return self._doorbell

    def _full(self) -> bool:
        """No channel with a consumer may take a message now (its prefetch is used up)."""
        consuming = [channel for channel in self.channels if channel._consumers]
        return bool(consuming) and not any(channel.qos.can_consume() for channel in consuming)

    def drain_events(self, connection, timeout=None):  # type: ignore[override]  # kombu's virtual signature
        started = monotonic()
        bell = self._bell()
        cycle = self.cycle
        assert cycle is not None
        while True:
            self.slot_freed.clear()  # before the poll: an ack during it still ends the wait below
            if bell is not None:
                bell.rang()  # what the poll below sees is not news
            try:
                cycle.get(self._deliver, timeout=timeout)
            except Empty:
                now = monotonic()
                if timeout is not None and now - started >= timeout:
                    raise TimeoutError() from None
                wait = self.polling_interval
                if timeout is not None:
                    wait = min(wait, started + timeout - now)
                self._wait(bell, now + wait)
            else:
                self._last_work = monotonic()
                return

    def _wait(self, bell: _Doorbell | None, until: float) -> None:
        if self._full() or bell is None:
            self.slot_freed.wait(max(0.0, until - monotonic()))
            return
        tick = self.wake_interval
        if monotonic() - self._last_work > self.idle_after:
            tick = max(tick, self.polling_interval / 5)
        while True:
            left = until - monotonic()
            if left <= 0 or self.slot_freed.wait(min(tick, left)) or bell.rang():
                return
