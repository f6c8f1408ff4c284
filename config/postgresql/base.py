"""Django's PostgreSQL backend, with a health check that costs no round trip when nothing happened.

``CONN_HEALTH_CHECKS`` makes Django send ``SELECT 1`` before the first query of
every request (and of every Celery task, :mod:`config.celery`) on a connection it
keeps: one more round trip to PostgreSQL per fire, the only one the test client
(which skips ``request_started``'s connection checks) never showed in ``bench
--profile``. An idle connection has nothing to read: when the server ends the
session (restart, ``pg_terminate_backend``, ``idle_session_timeout``) it sends an
error and closes the socket, which makes it readable. So the check polls the
socket first, and only when something arrived, when psycopg already knows the
connection is broken, or when it is not idle outside a transaction, asks the
server with ``SELECT 1`` as before (which then fails, and Django reconnects).
A link that dies silently is found no sooner or later than before: ``SELECT 1``
would wait on it just as the request's own first query does.
"""

from __future__ import annotations

import select

from django.db.backends.postgresql import base
from psycopg import pq


class DatabaseWrapper(base.DatabaseWrapper):
    def is_usable(self) -> bool:
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        if conn.info.transaction_status == pq.TransactionStatus.IDLE and hasattr(select, "poll"):
            poller = select.poll()
            poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
            if not poller.poll(0):
                return True
        return super().is_usable()
