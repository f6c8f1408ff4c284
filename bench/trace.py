"""``bench --http --trace``: where the time of one fire → final goes, stamp by stamp.

The traced topology is the one ``up`` runs, with hooks added at process start and
nothing changed in the product's code: the web server serves
``bench.trace_asgi:application`` (``ops.asgi``'s application, wrapped), and each
Celery worker imports :mod:`bench.trace_worker` (``--include``), which connects to
Celery's signals. Every process appends ``[key, stage, unix time]`` lines to a file
of its own under ``$AUTOPLANE_DATA_DIR/bench-trace/``; one clock (``time.time``)
serves every process of the machine. The client sends an ``X-Bench-Trace`` header
(the key of its stamps); the web process ties that key to the run it created, and
the worker stamps by run id. :func:`segments` joins them into per-fire durations.

Stages, in the order a fire passes them:

* ``client.send`` — the client starts writing the request;
* ``web.asgi`` — gunicorn's worker parsed the request and called the application;
* ``web.wsgi`` — a thread of the WSGI pool took it (Django's handler starts);
* ``web.view`` — the fire service was called (middleware and URL routing done);
* ``web.dispatch`` — authenticated, rate-limited, body read and parsed: dispatch starts;
* ``run.inserted`` — the run's rows are written (on PostgreSQL in one multi-statement
  query that also commits them; elsewhere inside the transaction);
* ``db.committed`` — committed: the on-commit publish starts;
* ``broker.published`` — the execute message was published;
* ``web.response`` — Django returned the response (to the WSGI adapter);
* ``client.response`` — the client read the whole response;
* ``worker.received`` — the worker's consumer received the message (``task_received``);
* ``worker.prerun`` — a pool process starts the task (``task_prerun``);
* ``row.started_at`` / ``row.finished_at`` — the run row's own timestamps;
* ``worker.postrun`` — the task returned (the run's final transaction committed);
* ``client.seen`` — the client saw the run final.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

HEADER = "X-Bench-Trace"
ENV_HEADER = "HTTP_X_BENCH_TRACE"
DIR_NAME = "bench-trace"

# (from, to) pairs reported, in the order of a fire's life; both client.response and
# worker.received follow broker.published (the response and the worker race).
SEGMENTS = [
    ("client.send", "web.asgi", "request sent → gunicorn calls the app"),
    ("web.asgi", "web.wsgi", "→ a WSGI pool thread takes it"),
    ("web.wsgi", "web.view", "→ fire service called (middleware, routing)"),
    ("web.view", "web.dispatch", "→ authenticated, rate limit, body parsed"),
    ("web.dispatch", "run.inserted", "→ run, last_fired_at and audit written"),
    ("run.inserted", "db.committed", "→ committed"),
    ("db.committed", "broker.published", "→ execute message published"),
    ("broker.published", "web.response", "→ Django returns the response"),
    ("web.response", "client.response", "→ client has the response"),
    ("broker.published", "worker.received", "published → worker consumer receives it"),
    ("worker.received", "worker.prerun", "→ pool process starts the task"),
    ("worker.prerun", "row.started_at", "→ run claimed (row started_at)"),
    ("row.started_at", "row.finished_at", "→ run finished (row finished_at)"),
    ("row.finished_at", "worker.postrun", "→ task returns (final commit)"),
    ("worker.postrun", "client.seen", "→ client sees it final"),
    ("client.send", "client.response", "total: the fire request, client-side"),
    ("client.send", "client.seen", "total: fire → seen final"),
]

_local = threading.local()
_files: dict[int, object] = {}
_lock = threading.Lock()


def trace_dir() -> Path:
    from django.conf import settings

    return Path(settings.DATA_DIR) / DIR_NAME


def stamp(key: str, stage: str, at: float | str | None = None) -> None:
    """Append one stamp to this process's file (opened on first use after any fork)."""
    at = time.time() if at is None else at
    pid = os.getpid()
    with _lock:
        out = _files.get(pid)
        if out is None:
            directory = trace_dir()
            directory.mkdir(parents=True, exist_ok=True)
            out = _files[pid] = open(directory / f"{pid}.jsonl", "a", buffering=1)  # noqa: SIM115
        out.write(json.dumps([key, stage, at]) + "\n")  # type: ignore[attr-defined]


def link(key: str, run_id: str) -> None:
    """Tie a trace key to the run its request created (the worker stamps by run id)."""
    stamp(key, "run", run_id)


def current_key() -> str | None:
    return getattr(_local, "key", None)


def set_key(key: str | None) -> None:
    _local.key = key


def clear(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for path in directory.glob("*.jsonl"):
        path.unlink(missing_ok=True)


def load(directory: Path) -> dict[str, dict[str, Any]]:
    """Every key's stages (the earliest of each); a run's stamps merged into the key that created it."""
    stamps: dict[str, dict[str, Any]] = {}
    runs: dict[str, str] = {}
    for path in directory.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                key, stage, at = json.loads(line)
            except ValueError:
                continue  # a line cut by a killed process
            if stage == "run":
                runs[at] = key
            else:
                stages = stamps.setdefault(key, {})
                stages[stage] = min(at, stages.get(stage, at))
    for run_id, key in runs.items():
        stamps.setdefault(key, {}).update(stamps.pop(run_id, {}), run=run_id)
    return stamps


def segments(traces: list[dict[str, float]]) -> list[tuple[str, str, float, int]]:
    """``(from → to, label, p50 ms, samples)`` for each pair of SEGMENTS both stamped in a trace."""
    from bench.engine_bench import pct

    rows = []
    for start, end, label in SEGMENTS:
        deltas = [(t[end] - t[start]) * 1000 for t in traces if start in t and end in t]
        if deltas:
            rows.append((f"{start} → {end}", label, pct(deltas, 0.5), len(deltas)))
    return rows
