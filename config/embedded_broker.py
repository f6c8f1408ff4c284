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


class Channel(sqlalchemy.Channel):
    def _restore(self, message) -> None:
        # Marked as Redis and RabbitMQ mark a message given back (a worker died holding it):
        # kombu's virtual transports set a flag the receiving side never reads.
        message.delivery_info["redelivered"] = True
        super()._restore(message)


class Transport(sqlalchemy.Transport):
    Channel = Channel
    polling_interval = settings.EMBEDDED_BROKER_POLLING_INTERVAL
