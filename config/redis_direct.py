"""One Redis connection per thread and URL, used without redis-py's pool, for the fire's two commands.

A command through ``redis.Redis`` checks a connection out of the pool and back in
each time: a lock, its observability counters, an event dispatch and a ``can_read``
poll with two socket timeout changes, ~150 Python calls around a one-line command.
The webhook fire sends two (the rate-limit count, the execute message) from the few
WSGI threads of a process, so each thread keeps its own connection per URL here and
writes the commands itself. What the pool's checkout guarded against is kept: a
connection the server closed meanwhile (a restart) or with stray unread bytes is
replaced before it is used, by one non-blocking peek at its socket.

Loaded on first use only: the embedded lane never imports ``redis``.
"""

from __future__ import annotations

import os
import select
import socket
import threading
from typing import Any

import redis

_local = threading.local()


def _clean(conn: Any, sock: socket.socket) -> bool:
    """True when nothing is waiting to be read: neither the server's goodbye nor a stray reply."""
    if hasattr(sock, "context"):  # TLS: buffered bytes are the SSL layer's; ask redis-py
        return not conn.can_read()
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable


def connection(url: str, timeout: float) -> Any:
    """This thread's connected ``redis.Connection`` for ``url`` (made, or replaced, as needed)."""
    connections: dict[str, Any] | None = getattr(_local, "connections", None)
    if connections is None or _local.pid != os.getpid():  # a fork copies thread-locals
        connections = _local.connections = {}
        _local.pid = os.getpid()
    conn = connections.get(url)
    if conn is None:
        pool = redis.ConnectionPool.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        conn = connections[url] = pool.connection_class(**pool.connection_kwargs)
    sock = getattr(conn, "_sock", None)
    if sock is not None and not _clean(conn, sock):
        conn.disconnect()
        sock = None
    if sock is None:
        conn.connect()
    return conn


def discard(url: str) -> None:
    """Close this thread's connection for ``url`` (after a failure: the next use starts afresh)."""
    conn = (getattr(_local, "connections", None) or {}).pop(url, None)
    if conn is not None:
        try:
            conn.disconnect()
        except Exception:  # noqa: S110 - closing a connection that already failed
            pass
