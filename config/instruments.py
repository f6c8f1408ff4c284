"""Prometheus counters and histograms, counted where things happen (docs/operations.md, "Metrics").

Every app may import this module (it imports none of ours), so a run finishing
in a worker, a webhook refused by the web server or an approval expiring in the
housekeeping worker each count in the process that did it. An increment is an
in-memory float add (plus, in multiprocess mode, an 8-byte write into an mmap):
no database, no broker, no lock shared between processes.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (``manage.py up``
sets and empties one per instance; docker-compose shares a volume), each process
writes its values to files there and ``/metrics`` adds them up, so counters of
gunicorn's and Celery's processes are one series and survive a process's exit.
The files are named by host and pid, so containers sharing the directory never
write into each other's. Without it the values live in this process only (tests,
``runserver``).

Counts are taken right after the write they count succeeded (past its claim
fence), not on commit: registering an ``on_commit`` callback per event would cost
more than the count. A transaction rolled back after that (a worker crashing
inside a batch of quick steps) may have counted an event that did not stick.
"""

from __future__ import annotations

import os
import socket
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Histogram, values
from prometheus_client.metrics import MetricWrapperBase

MULTIPROC_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
_HOST = socket.gethostname().replace("_", "-")

if MULTIPROC_DIR:
    os.makedirs(MULTIPROC_DIR, mode=0o700, exist_ok=True)  # a missing directory would fail every count
    # prometheus_client names its files <type>_<pid>.db; containers sharing the directory
    # have the same pids (1, 7, ...), so the host name goes in too (without '_', the separator).
    values.ValueClass = values.MultiProcessValue(lambda: f"{_HOST}-{os.getpid()}")

# From a few milliseconds (a transform step) to the long queue's hour.
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                    3600.0)  # fmt: skip

RUNS_FINISHED = Counter(
    "autoplane_runs_finished", "Runs that reached a final status, by status and queue.", ["status", "queue"]
)
RUN_DURATION = Histogram(
    "autoplane_run_duration_seconds", "Whole runs, created to finished, by final status and queue.",
    ["status", "queue"], buckets=DURATION_BUCKETS,
)  # fmt: skip
RUN_QUEUE_WAIT = Histogram(
    "autoplane_run_queue_wait_seconds", "Queue wait of runs when a worker first starts them: start - enqueue.",
    ["queue"], buckets=DURATION_BUCKETS,
)  # fmt: skip
STEPS = Counter(
    "autoplane_steps", "Step attempts by action and outcome (succeeded, failed, retrying, waiting, skipped, "
    "cancelled, recovered, outcome_unknown).", ["action", "outcome"],
)  # fmt: skip
STEP_DURATION = Histogram(
    "autoplane_step_duration_seconds", "Duration of step attempts that ran a handler, by action.",
    ["action"], buckets=DURATION_BUCKETS,
)  # fmt: skip
STEP_RETRIES = Counter(
    "autoplane_step_retries", "Step attempts that failed and were scheduled again.", ["action"]
)
RUN_RECOVERIES = Counter(
    "autoplane_run_recoveries", "Runs picked up after their worker was lost mid-step, by what was done.",
    ["outcome"],
)  # fmt: skip
FIRES = Counter(
    "autoplane_fires", "Fires reaching the dispatcher, by trigger type and result (created, suppressed, replayed).",
    ["trigger_type", "result"],
)  # fmt: skip
WEBHOOK_REJECTIONS = Counter(
    "autoplane_webhook_rejections", "Webhook fires refused, by error code.", ["code"]
)
APPROVALS = Counter(
    "autoplane_approvals",
    "Approvals requested, and decided by outcome (approved, denied, expired).",
    ["event"],
)
HTTP_REQUESTS = Counter(
    "autoplane_http_requests", "HTTP requests answered, by method, route and status class.",
    ["method", "route", "status"],
)  # fmt: skip
HTTP_DURATION = Histogram(
    "autoplane_http_request_duration_seconds", "Time to answer an HTTP request (the view and middleware).",
    ["method", "route"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)  # fmt: skip


# Each metric's child per label values, the object labels() returns; labels() checks and
# converts the values and takes the metric's lock on every call (7 Python calls, ~0.6 us).
_children: dict[tuple[Any, ...], Any] = {}


def _child(metric: MetricWrapperBase, *labels: str) -> Any:
    child = _children.get((metric, *labels))
    if child is None:
        child = _children[(metric, *labels)] = metric.labels(*labels)
    return child


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


def run_finished(
    *, status: str, queue: str, created_at: datetime | None, finished_at: datetime | None
) -> None:
    duration = _seconds(created_at, finished_at)

    _child(RUNS_FINISHED, status, queue).inc()
    if duration is not None:
        _child(RUN_DURATION, status, queue).observe(duration)


def run_started(*, queue: str, enqueued_at: datetime | None, started_at: datetime | None) -> None:
    wait = _seconds(enqueued_at, started_at)
    if wait is not None:
        _child(RUN_QUEUE_WAIT, queue).observe(wait)


def step_outcome(*, action: str, outcome: str, started_at: datetime | None = None,
                 finished_at: datetime | None = None) -> None:  # fmt: skip
    duration = _seconds(started_at, finished_at)

    _child(STEPS, action, outcome).inc()
    if outcome == "retrying":
        _child(STEP_RETRIES, action).inc()
    if duration is not None:
        _child(STEP_DURATION, action).observe(duration)


def run_recovered(*, outcome: str) -> None:
    _child(RUN_RECOVERIES, outcome).inc()


def fired(*, trigger_type: str, result: str) -> None:
    _child(FIRES, trigger_type, result).inc()


def webhook_rejected(*, code: str) -> None:
    _child(WEBHOOK_REJECTIONS, code).inc()


def approval_event(event: str) -> None:
    _child(APPROVALS, event).inc()


def http_request(*, method: str, route: str, status: int, seconds: float) -> None:
    _child(HTTP_REQUESTS, method, route, f"{status // 100}xx").inc()
    _child(HTTP_DURATION, method, route).observe(seconds)
