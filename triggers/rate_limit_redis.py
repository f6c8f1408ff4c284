"""Webhook rate-limit windows counted in Redis: the Redis lane's side of :func:`triggers.webhooks.rate_limit_hit`.

Loaded by :mod:`triggers.webhooks` on the first fire counted in Redis (``import_module``), so
a process on the embedded lane, where ``AUTOPLANE_RATE_LIMIT_REDIS_URL`` is empty, never
imports ``redis`` (~0.3 s per process).

The count is sent by :func:`count_start` and its answer read by the function it returns, so
that the fire checks and parses its body while Redis answers (:mod:`config.redis_direct`:
the thread's own connection, no pool).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis

from config import redis_direct, seams

logger = logging.getLogger("triggers.webhooks")

# One attempt: a Redis that does not answer costs a fire one timeout, not several backoffs.
SOCKET_TIMEOUT_SECONDS = 1.0
WINDOW_TTL_SECONDS = 120  # the window and the next: nothing to clean up


def _failed(exc: BaseException) -> None:
    if isinstance(exc, redis.RedisError):
        logger.warning("webhook rate limit: Redis failed (%r); counting in the database", exc)
    else:
        # redis-py can fail outside its own exception types (seen: a handshake timing out under
        # load ends in ``ValueError: I/O operation on closed file``). The fire must not become a
        # 500 over a counter: count in the database, and start from a fresh connection next time.
        logger.warning("webhook rate limit: Redis client failed (%r); counting in the database", exc)


_clients: dict[str, redis.Redis] = {}  # the public path: one pooled client per URL


def _public_count(url: str, key: str) -> int | None:
    """INCR + EXPIRE in one round trip through redis-py's public client and pool."""
    try:
        client = _clients.get(url)
        if client is None:
            client = _clients.setdefault(url, redis.Redis.from_url(
                url, socket_timeout=SOCKET_TIMEOUT_SECONDS, socket_connect_timeout=SOCKET_TIMEOUT_SECONDS))  # fmt: skip
        pipe = client.pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, WINDOW_TTL_SECONDS)
        count, _ = pipe.execute()
        return int(count)
    except Exception as exc:
        _failed(exc)
        return None


def count_start(url: str, key: str) -> Callable[[], int | None]:
    """Send INCR + EXPIRE for ``key`` in one write; the returned function reads the window's count
    after this attempt (None if Redis failed). It must be called, once, on the same thread.
    With the fast path off (:mod:`config.seams`), redis-py's public client counts, at once."""
    if not seams.fast_path("redis"):
        count = _public_count(url, key)
        return lambda: count
    try:
        conn = redis_direct.connection(url, SOCKET_TIMEOUT_SECONDS)
        conn.send_packed_command(
            conn.pack_commands([("INCR", key), ("EXPIRE", key, WINDOW_TTL_SECONDS)]), check_health=False
        )
    except Exception as exc:
        redis_direct.discard(url, SOCKET_TIMEOUT_SECONDS)
        _failed(exc)
        return lambda: None

    def hits() -> int | None:
        try:
            count = conn.read_response()
            conn.read_response()
            return int(count)
        except Exception as exc:
            redis_direct.discard(url, SOCKET_TIMEOUT_SECONDS)
            _failed(exc)
            return None

    return hits


def window_hits(url: str, key: str) -> int | None:
    """The window's count after this attempt, in one round trip (INCR + EXPIRE); None if Redis fails."""
    return count_start(url, key)()
