"""A Celery task message sent by name to a Redis broker in one ``LPUSH``, without kombu's publish path.

``app.send_task`` spends ~1,700 Python function calls on one message (routing, the
task message, kombu's producer pool, channel, retry wrappers, its own connection
pool): a third of a webhook fire's Python work. On a Redis broker the result is one
``LPUSH <queue> <json>``. :func:`publish` writes that JSON itself, the same document
``send_task(name, args=..., queue=..., ignore_result=True)`` writes (field for field,
in the same order; ``tests/automations/test_enqueue_publish.py`` compares the bytes), so
workers, the relay's ``LLEN`` and Flower see an ordinary Celery message.

:func:`usable` says when that is so; otherwise the caller uses ``send_task``:

- the broker is ``redis://`` with no transport option but ``visibility_timeout``
  (no key prefix, priority steps or socket options that kombu would apply);
- protocol 2, JSON, no compression, no sent event (the app's configuration);
- no receiver of ``before_task_publish``/``after_task_publish`` (OpenTelemetry's
  Celery instrumentation adds its context to the headers there);
- not inside a worker's task (``send_task`` would set ``parent_id``/``root_id``).

Loaded on first use only: the embedded lane never imports ``redis``. Each thread pushes
on its own connection (:mod:`config.redis_direct`); a failure raises, as ``send_task``
would, and the caller's run stays queued for the relay.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import socket
import uuid
from collections.abc import Callable
from typing import Any

import redis
from celery import signals

from config import redis_direct
from config.celery import app

_ALLOWED_TRANSPORT_OPTIONS = {"visibility_timeout"}
# A publish that waits on a broker that stopped answering holds a web thread: bounded, and
# the run it announces is committed (the relay publishes it if this fails).
SOCKET_TIMEOUT_SECONDS = 5.0


@functools.cache
def _configured() -> bool:
    conf = app.conf
    options = set(conf.broker_transport_options or {})
    return (
        str(conf.broker_url or "").startswith("redis://")
        and "?" not in str(conf.broker_url)
        and options <= _ALLOWED_TRANSPORT_OPTIONS
        and int(conf.task_protocol) == 2
        and conf.task_serializer == "json"
        and not conf.task_compression
        and not conf.task_send_sent_event
        and conf.task_default_delivery_mode in ("persistent", 2)
    )


def usable() -> bool:
    """True when :func:`publish` writes what ``send_task`` would (see the module's conditions)."""
    return (
        _configured()
        and not signals.before_task_publish.receivers
        and not signals.after_task_publish.receivers
        and app.current_worker_task is None
    )


@functools.cache
def _origin() -> str:
    # celery.utils.nodenames.anon_nodename(): "gen<pid>@<hostname>"; cached per process (pid).
    return f"gen{os.getpid()}@{socket.gethostname()}"


os.register_at_fork(after_in_child=_origin.cache_clear)

_EMBED = ', {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'


def message(name: str, args: list[str], queue: str, task_id: str, delivery_tag: str) -> str:
    """The JSON document kombu's Redis transport pushes for ``send_task(name, args, queue=queue,
    ignore_result=True, task_id=task_id)`` (its ``delivery_tag`` being ``delivery_tag``)."""
    body = "[" + json.dumps(args) + _EMBED
    document: dict[str, Any] = {
        "body": base64.b64encode(body.encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py", "task": name, "id": task_id, "shadow": None, "eta": None, "expires": None,
            "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": task_id,
            "parent_id": None, "argsrepr": repr(args), "kwargsrepr": "{}", "origin": _origin(),
            "ignore_result": True, "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {},
        },
        "properties": {
            "correlation_id": task_id, "reply_to": app.thread_oid, "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
            "body_encoding": "base64", "delivery_tag": delivery_tag,
        },
    }  # fmt: skip
    return json.dumps(document)


def publish(name: str, args: list[str], queue: str, *, on_lost: Callable[[BaseException], None]) -> str:
    """Push the task message onto ``queue``; returns its task id. Raises when it cannot be sent.

    On the thread's own connection (:mod:`config.redis_direct`), retried once on a fresh
    one when sending fails, as kombu's publish retry would (a broker restart); a broker
    that is down fails at once. Redis' reply is not waited for: nothing the caller
    answers depends on it (the run is committed, and a run whose message is lost is
    published by the relay). It is read before the thread's next publish, and
    ``on_lost(error)`` called then if the push failed.
    """
    task_id = str(uuid.uuid4())
    url = app.conf.broker_url
    packed: list[bytes] | None = None
    for attempt in (1, 2):
        try:
            conn = redis_direct.connection(url, SOCKET_TIMEOUT_SECONDS)
            if packed is None:
                packed = conn.pack_command(
                    "LPUSH", queue, message(name, args, queue, task_id, str(uuid.uuid4()))
                )
            conn.send_packed_command(packed, check_health=False)
            redis_direct.sent_unanswered(url, SOCKET_TIMEOUT_SECONDS, on_lost)
            return task_id
        except (redis.ConnectionError, redis.TimeoutError):
            redis_direct.discard(url, SOCKET_TIMEOUT_SECONDS)
            if attempt == 2:
                raise
        except BaseException:
            redis_direct.discard(url, SOCKET_TIMEOUT_SECONDS)
            raise
    raise AssertionError("unreachable")
