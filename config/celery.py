"""The Celery app: four queues, routing by task name, beat on the database scheduler."""

from __future__ import annotations

import gc
import os

from celery import Celery
from celery.fixups.django import DjangoFixup, DjangoWorkerFixup
from django.conf import settings
from kombu import Exchange, Queue
from kombu.exceptions import ChannelError
from kombu.transport import TRANSPORT_ALIASES

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")


class _WorkerFixup(DjangoWorkerFixup):
    """Celery's Django fixup closes every database connection before and after every task, so
    each run opened a new PostgreSQL connection (a backend fork, then every statement planned
    against cold catalog caches: ~10 ms of a one-step run's life). Between tasks, Django's own
    rule for requests applies instead: a connection is closed when it is broken or older than
    ``CONN_MAX_AGE``, and checked before reuse (``CONN_HEALTH_CHECKS``)."""

    def close_database(self, **kwargs) -> None:
        self._db.close_old_connections()

    def install(self) -> DjangoWorkerFixup:
        super().install()
        self._close_database()  # the prefork parent: no connection is inherited by its children
        return self

    def on_worker_process_init(self, **kwargs) -> None:
        """A pool process, just forked: what it inherited and set up (Django, the tasks, the
        capabilities; ~160k objects) is moved out of the cyclic garbage collector's reach, as
        ``ops.asgi`` does for the web: a full collection walked all of it, a ~100 ms pause
        every ~800 one-step runs that lands on a run's latency (docs/performance.md)."""
        super().on_worker_process_init(**kwargs)
        gc.collect()
        gc.freeze()


class _Fixup(DjangoFixup):
    @property
    def worker_fixup(self) -> DjangoWorkerFixup:
        # Made on first use, like Celery's: it reads the app's configuration, not loaded yet here.
        fixup: DjangoWorkerFixup | None = self.__dict__.get("_worker_fixup")
        if fixup is None:
            fixup = self.__dict__["_worker_fixup"] = _WorkerFixup(self.app)
        return fixup


def _django_fixup(app: Celery) -> DjangoFixup:
    return _Fixup(app).install()


app = Celery("autoplane", fixups=[_django_fixup])
# The embedded broker (sqla+sqlite://) with its polling interval; kombu imports it on first connect.
TRANSPORT_ALIASES["sqla"] = TRANSPORT_ALIASES["sqlalchemy"] = "config.embedded_broker:Transport"
# Redis: kombu's transport, with a worker that survives losing the broker (config/redis_broker.py).
TRANSPORT_ALIASES["redis"] = TRANSPORT_ALIASES["rediss"] = "config.redis_broker:Transport"
app.config_from_object("django.conf:settings", namespace="CELERY")

# Duration classes (SPEC §7.1): a run goes to the queue of its longest step.
QUEUE_FAST = "automations_fast"  # < 10 s
QUEUE_MEDIUM = "automations_medium"  # < 5 min
QUEUE_LONG = "automations_long"  # <= 1 h
QUEUE_DEFAULT = "default"  # platform housekeeping
QUEUES = (QUEUE_DEFAULT, QUEUE_FAST, QUEUE_MEDIUM, QUEUE_LONG)


def _queue_arguments(broker_url: str, visibility_timeout: int) -> dict[str, int]:
    """RabbitMQ closes a consumer that holds a message unacked past its consumer timeout (30 min by
    default), and execute_run holds its message while the run executes (acks_late), up to the
    long queue's hour. Each queue's own timeout is the visibility timeout Redis uses for the
    same purpose (RabbitMQ >= 3.12; older ones: ops/rabbitmq.conf)."""
    if broker_url.startswith(("amqp://", "amqps://", "pyamqp://")):
        return {"x-consumer-timeout": visibility_timeout * 1000}
    return {}


def _queues() -> dict[str, list[Queue]]:
    arguments = _queue_arguments(settings.CELERY_BROKER_URL, settings.CELERY_VISIBILITY_TIMEOUT)
    queues = [
        Queue(name, Exchange(name), routing_key=name, queue_arguments=arguments or None) for name in QUEUES
    ]
    return {"task_queues": queues}


# Read when Celery's configuration is first used, not now: importing the settings module
# imports this one (config/__init__.py), so the settings may not be loaded yet.
app.add_defaults(_queues)
app.conf.update(
    task_default_queue=QUEUE_DEFAULT,
    task_default_exchange=QUEUE_DEFAULT,
    task_default_routing_key=QUEUE_DEFAULT,
    # Run execution is routed per run by the dispatcher (apply_async(queue=...));
    # everything else is housekeeping on the default queue.
    task_routes={"autoplane.*": {"queue": QUEUE_DEFAULT}},
    task_serializer="json",
    accept_content=["json"],
    result_serializer="json",
    task_ignore_result=True,
    result_expires=3600,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    task_acks_late=False,
    task_reject_on_worker_lost=False,
    task_time_limit=3 * 3600,
    broker_connection_retry_on_startup=True,
    beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler",
    timezone="UTC",
    enable_utc=True,
)
app.autodiscover_tasks()


BROKER_TIMEOUT_SECONDS = 3.0


def queue_backlog(
    queues: tuple[str, ...] = QUEUES, timeout: float = BROKER_TIMEOUT_SECONDS
) -> dict[str, int]:
    """Messages waiting in each queue, from a fresh broker connection (raises when unreachable)."""
    backlog: dict[str, int] = {}
    with app.connection_for_read(connect_timeout=timeout) as conn:
        conn.ensure_connection(max_retries=0, timeout=timeout)
        channel = conn.default_channel
        for queue in queues:
            try:
                backlog[queue] = channel.queue_declare(queue=queue, passive=True).message_count
            except ChannelError:  # Redis: an empty queue does not exist as a key
                backlog[queue] = 0
    return backlog


@app.task(name="autoplane.ping", ignore_result=False)
def ping(value: object = None) -> dict:
    """A no-op used by health checks, tests and the bare-Celery benchmark baseline."""
    import socket

    return {"value": value, "worker": socket.gethostname(), "pid": os.getpid()}


@app.task(name="autoplane.sleep", ignore_result=True)
def sleep(seconds: float = 0.1) -> None:
    """Occupies a worker; the benchmark uses it to back a queue up (queue isolation)."""
    import time

    time.sleep(min(float(seconds), 60.0))
