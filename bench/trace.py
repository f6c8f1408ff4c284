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
import sys
import threading
import time
from collections.abc import Sequence
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

TRACES_FILE = "traces.json"  # the merged stamps of the last traced run (not *.jsonl: clear() keeps it)

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
    for pattern in ("*.jsonl", "gc-*.log"):
        for path in directory.glob(pattern):
            path.unlink(missing_ok=True)


GC_MIN_MS = 0.5  # collections shorter than this are not logged (a gen-0 one takes ~0.05 ms)
_gc_started: list[float] = []


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    """Log each cyclic-GC collection of this process of ``GC_MIN_MS`` or more to ``gc-<pid>.log``:
    ``start (unix time), ms, generation, objects collected`` (read by :func:`gc_pauses`)."""
    if phase == "start":
        _gc_started[:] = [time.time()]
        return
    if not _gc_started:
        return
    began = _gc_started.pop()
    ms = (time.time() - began) * 1000
    if ms >= GC_MIN_MS:
        with _lock:
            directory = trace_dir()  # a fresh clone's first traced run: not made yet
            directory.mkdir(parents=True, exist_ok=True)
            with open(directory / f"gc-{os.getpid()}.log", "a") as out:
                out.write(f"{began:.6f} {ms:.3f} {info.get('generation')} {info.get('collected')}\n")


def watch_gc() -> None:
    """Log this process's (and its forked children's) longer GC collections; see :func:`_gc_callback`."""
    import gc

    if _gc_callback not in gc.callbacks:
        gc.callbacks.append(_gc_callback)


def gc_pauses(directory: Path) -> list[tuple[float, float, int, str]]:
    """Every logged collection: ``(start, ms, generation, pid)``, by start."""
    pauses = []
    for path in directory.glob("gc-*.log"):
        pid = path.stem.removeprefix("gc-")
        for line in path.read_text().splitlines():
            try:
                began, ms, generation, _ = line.split()
                pauses.append((float(began), float(ms), int(generation), pid))
            except ValueError:
                continue
    return sorted(pauses)


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
    """``(from → to, label, p50 ms, samples)`` for each pair of SEGMENTS both stamped in a trace.

    The traces are also kept in ``traces.json`` of the trace directory, for
    ``python -m bench.trace slowest N`` (the stages of the slowest fires).
    """
    from bench.engine_bench import pct

    try:
        trace_dir().mkdir(parents=True, exist_ok=True)
        (trace_dir() / TRACES_FILE).write_text(json.dumps(traces))
    except OSError:
        pass  # the figures do not depend on it
    rows = []
    for start, end, label in SEGMENTS:
        deltas = [(t[end] - t[start]) * 1000 for t in traces if start in t and end in t]
        if deltas:
            rows.append((f"{start} → {end}", label, pct(deltas, 0.5), len(deltas)))
    return rows


# The stages in the order a fire passes them (the worker's after the response's; they race).
STAGES = [
    "client.send", "web.asgi", "web.wsgi", "web.view", "web.dispatch", "run.inserted", "db.committed",
    "broker.published", "web.response", "client.response", "worker.received", "worker.prerun",
    "row.started_at", "row.finished_at", "worker.postrun", "client.seen",
]  # fmt: skip


def slowest(
    traces: list[dict[str, float]], count: int, pauses: Sequence[tuple[float, float, int, str]] = ()
) -> list[str]:
    """The ``count`` slowest fires (send → seen), each as one line per stage: ms since the previous
    stage, with the p50 of that step over all traces beside it, and the wall-clock time of the send;
    then the logged GC ``pauses`` (:func:`gc_pauses`) that overlap the fire."""
    from bench.engine_bench import pct

    def steps(t: dict[str, float]) -> list[tuple[str, float]]:
        present = [s for s in STAGES if s in t]
        return [(f"{a} → {b}", (t[b] - t[a]) * 1000) for a, b in zip(present, present[1:], strict=False)]

    done = [t for t in traces if "client.send" in t and "client.seen" in t]
    typical: dict[str, list[float]] = {}
    for t in done:
        for name, ms in steps(t):
            typical.setdefault(name, []).append(ms)
    p50 = {name: pct(values, 0.5) for name, values in typical.items()}
    total = sorted((t["client.seen"] - t["client.send"]) * 1000 for t in done)
    lines = [
        f"{len(done)} traced fires: send → seen p50 {pct(total, 0.5):.2f} ms, p99 {pct(total, 0.99):.2f} ms"
    ]
    for t in sorted(done, key=lambda t: t["client.send"] - t["client.seen"])[:count]:
        at = (
            time.strftime("%H:%M:%S", time.gmtime(t["client.send"]))
            + f".{int(t['client.send'] % 1 * 1000):03d}"
        )
        lines.append(f"{(t['client.seen'] - t['client.send']) * 1000:8.2f} ms  sent {at} UTC")
        for name, ms in steps(t):
            excess = ms - p50.get(name, 0.0)
            flag = "  <<" if excess > 2.0 else ""
            lines.append(f"    {ms:7.2f} ms (p50 {p50.get(name, 0.0):6.2f})  {name}{flag}")
        for began, ms, generation, pid in pauses:
            if t["client.send"] <= began + ms / 1000 and began <= t["client.seen"]:
                offset = (began - t["client.send"]) * 1000
                lines.append(
                    f"    GC: generation {generation} in pid {pid}, {ms:.2f} ms, at +{offset:.1f} ms"
                )
    return lines


if __name__ == "__main__":  # python -m bench.trace slowest N [traces.json]
    if len(sys.argv) < 3 or sys.argv[1] != "slowest":
        sys.exit("usage: python -m bench.trace slowest N [path to traces.json]")
    if len(sys.argv) > 3:
        path = Path(sys.argv[3])
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        import django

        django.setup()
        path = trace_dir() / TRACES_FILE
    pauses = gc_pauses(path.parent)
    traces = json.loads(path.read_text())
    print("\n".join(slowest(traces, int(sys.argv[2]), pauses)))
    if pauses and traces:
        began = min(t["client.send"] for t in traces if "client.send" in t)
        pauses = [p for p in pauses if p[0] >= began]
        by_gen = {g: [ms for _, ms, gen, _ in pauses if gen == g] for g in sorted({p[2] for p in pauses})}
        print(
            f"GC collections of {GC_MIN_MS} ms or more since the first traced fire: "
            + ", ".join(f"gen {g}: {len(v)} (max {max(v):.1f} ms)" for g, v in by_gen.items())
        )


if {"bench.trace_asgi:application", "bench.trace_worker"} & set(sys.argv) or "--trace" in sys.argv:
    watch_gc()  # a traced server process (gunicorn's, a Celery worker's) or the tracing client
