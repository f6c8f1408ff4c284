"""Webhook rate-limit windows counted in Redis: the Redis lane's side of :func:`triggers.webhooks.rate_limit_hit`.

Loaded by :mod:`triggers.webhooks` on the first fire counted in Redis (``import_module``), so
a process on the embedded lane, where ``AUTOPLANE_RATE_LIMIT_REDIS_URL`` is empty, never
imports ``redis`` (~0.3 s per process).
"""

from __future__ import annotations

import functools
import logging

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger("triggers.webhooks")


@functools.cache
def _client(url: str) -> redis.Redis:
    # One attempt: a Redis that does not answer costs a fire one timeout, not several backoffs.
    return redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0,
                                retry=Retry(NoBackoff(), 0))  # fmt: skip


def window_hits(url: str, key: str) -> int | None:
    """The window's count after this attempt, in one round trip (INCR + EXPIRE); None if Redis fails."""
    try:
        pipe = _client(url).pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, 120)  # the window and the next: nothing to clean up
        return int(pipe.execute()[0])
    except redis.RedisError as exc:
        logger.warning("webhook rate limit: Redis failed (%r); counting in the database", exc)
        return None
    except Exception as exc:
        # redis-py can fail outside its own exception types (seen: a handshake timing out under
        # load ends in ``ValueError: I/O operation on closed file``). The fire must not become a
        # 500 over a counter: count in the database, and start from a fresh client next time.
        logger.warning("webhook rate limit: Redis client failed (%r); counting in the database", exc)
        _client.cache_clear()
        return None
