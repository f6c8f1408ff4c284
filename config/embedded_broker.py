"""The embedded broker's kombu transport: kombu's SQLAlchemy transport, polling every
``CELERY_POLLING_INTERVAL`` seconds (settings.EMBEDDED_BROKER_POLLING_INTERVAL).

The interval cannot be a transport option: kombu hands those to SQLAlchemy's
create_engine(), which rejects the ones it does not know (kombu#2157). So it is a
class attribute of this subclass, which :mod:`config.celery` registers as kombu's
``sqla`` (and ``sqlalchemy``) transport by dotted path. kombu imports this module,
and SQLAlchemy with it, when a process first connects to an ``sqla+`` broker:
settings never load SQLAlchemy, and the Redis and RabbitMQ lanes never do.
"""

from __future__ import annotations

from django.conf import settings
from kombu.transport import sqlalchemy
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

    def _restore(self, message) -> None:
        # Marked as Redis and RabbitMQ mark a message given back (a worker died holding it):
        # kombu's virtual transports set a flag the receiving side never reads.
        message.delivery_info["redelivered"] = True
        super()._restore(message)


class Transport(sqlalchemy.Transport):
    Channel = Channel
    polling_interval = settings.EMBEDDED_BROKER_POLLING_INTERVAL
