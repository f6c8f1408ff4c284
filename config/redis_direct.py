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
from collections.abc import Callable
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


def _drain(conn: Any, waiting: list[Callable[[BaseException], None]]) -> bool:
    """Read the replies of commands sent without waiting; False if the connection failed meanwhile.

    Each command's ``on_error`` hears of its failure: an error reply, or a connection
    lost before its reply came (the command may or may not have run).
    """
    while waiting:
        try:
            conn.read_response()
        except redis.ResponseError as exc:  # that command failed; the connection is fine
            waiting.pop(0)(exc)
            continue
        except Exception as exc:
            for on_error in waiting:
                on_error(exc)
            waiting.clear()
            return False
        waiting.pop(0)
    return True


def _state() -> tuple[dict[tuple[str, float], Any], dict[tuple[str, float], list]]:
    if getattr(_local, "pid", None) != os.getpid():  # a fork copies thread-locals
        _local.connections, _local.waiting, _local.pid = {}, {}, os.getpid()
    return _local.connections, _local.waiting


def connection(url: str, timeout: float) -> Any:
    """This thread's connected ``redis.Connection`` for ``url`` and ``timeout`` (made, or replaced, as
    needed), with the replies to commands sent on it by :func:`sent_unanswered` read."""
    connections, waiting = _state()
    key = (url, timeout)
    conn = connections.get(key)
    if conn is None:
        pool = redis.ConnectionPool.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        conn = connections[key] = pool.connection_class(**pool.connection_kwargs)
    sock = getattr(conn, "_sock", None)
    if sock is not None and waiting.get(key) and not _drain(conn, waiting[key]):
        conn.disconnect()
        sock = None
    if sock is not None and not _clean(conn, sock):
        conn.disconnect()
        sock = None
    if sock is None:
        conn.connect()
    return conn


def sent_unanswered(url: str, timeout: float, on_error: Callable[[BaseException], None]) -> None:
    """The command just sent on this thread's connection is not waited for: its reply is read
    before the connection's next use, and ``on_error`` is called then if it failed."""
    _state()[1].setdefault((url, timeout), []).append(on_error)


def discard(url: str, timeout: float) -> None:
    """Close this thread's connection for ``url`` (after a failure: the next use starts afresh)."""
    connections, waiting = _state()
    conn = connections.pop((url, timeout), None)
    for on_error in waiting.pop((url, timeout), []):
        on_error(redis.ConnectionError("the connection was closed before the reply was read"))
    if conn is not None:
        try:
            conn.disconnect()
        except Exception:  # noqa: S110 - closing a connection that already failed
            pass
