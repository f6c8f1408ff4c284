"""``manage.py bench --http``: what a user sees, through the real ``up`` topology (issue 11).

Starts the same children ``manage.py up`` starts (the same web server command,
one Celery worker per queue, beat) on the configured database and broker, on a
free port. Then, in one invocation:

1. the bare Celery round trip on the same broker and the same fast-queue worker
   (``ping.apply_async().get()`` p50/p99, and the drain rate of 2n no-ops);
2. webhook ``POST /fire`` over HTTP → run final, one client: the client's clock
   from sending the request to seeing the run final, and the run's own
   ``created_at`` → ``finished_at``. "Seen final" is a poll of the run's status
   every ``--poll-ms`` (the database by default, as the issue measured; ``--see
   api`` polls ``GET /api/v1/runs/{id}`` over HTTP instead). The round trips of 1
   and the fires of 2 are taken in alternating blocks (:func:`alternating`);
3. sustained runs/s with 8 and 32 HTTP clients (fires from each client back to
   back; runs/s = runs / (first fire → last run seen final)), and the fire
   request's own rate;
4. the cost of each extra ``transform_data`` step (10-step vs 1-step plan);
5. runs/s with every run in one workspace vs the same load over 8 workspaces;
6. audit appends/s from 4 concurrent writer processes on one chain, verified.

Every figure is printed with its ratio to the Celery baseline and the issue's target.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection

from bench import trace
from bench.engine_bench import FINAL, celery_drain, celery_round_trips, pct
from bench.workers import Workers


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Topology(Workers):
    """The children ``manage.py up`` supervises, started with the same argv, each in its own group."""

    def __init__(self, *, web_workers: int, concurrency: dict[str, int], traced: bool = False):
        super().__init__(concurrency)
        self.port = _free_port()
        self.web_workers = web_workers
        self.traced = traced
        self.web_index = -1

    def web_cpu_seconds(self) -> float:
        """CPU time used so far by the web server's processes (gunicorn's master and workers: one group)."""
        return _group_cpu_seconds(self.procs[self.web_index].pid) if self.web_index >= 0 else float("nan")

    def __enter__(self) -> Topology:
        from ops.management.commands.up import build_specs

        log_dir = Path(settings.DATA_DIR) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        specs = build_specs(
            host="127.0.0.1", port=self.port, concurrency=self.concurrency, web_workers=self.web_workers
        )
        for spec in specs:
            if self.traced:
                spec = _traced(spec)
            if spec.name == "web":
                self.web_index = len(self.procs)
            log = open(log_dir / f"bench-http-{spec.name}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen(spec.argv, cwd=spec.cwd, env=spec.env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                conn.close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"web did not answer on port {self.port}") from None
                time.sleep(0.2)
        super().wait_ready(timeout=max(1.0, deadline - time.monotonic()))


def _group_cpu_seconds(group: int) -> float:
    """user + system CPU of the live processes of process group ``group`` (Linux /proc)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[2]) == group:  # pgrp
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _traced(spec):
    """The same child with bench.trace's hooks: the web app wrapped, each worker importing its signals."""
    from dataclasses import replace

    if spec.name == "web":
        return replace(spec, argv=[("bench.trace_asgi:application" if arg == "ops.asgi:application" else arg)
                                   for arg in spec.argv])  # fmt: skip
    if spec.name.startswith("worker-"):
        return replace(spec, argv=[*spec.argv, "--include", "bench.trace_worker"])
    return spec


class Client:
    """One keep-alive HTTP/1.1 connection (re-opened when the server closes it); one per thread."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def request(
        self, method: str, path: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes]:
        for attempt in (1, 2):
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                return response.status, response.read()
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.conn.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.conn.close()


@dataclass
class Target:
    automation_id: str
    token: str

    def fire(self, client: Client, i: int, trace_key: str | None = None) -> str:
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if trace_key is not None:
            headers[trace.HEADER] = trace_key
        status, body = client.request("POST", f"/api/v1/automations/{self.automation_id}/fire",
                                      b'{"n": %d}' % i, headers)  # fmt: skip
        if status != 202:
            raise RuntimeError(f"fire answered {status}: {body[:200]!r}")
        return json.loads(body)["run_id"]


@dataclass
class Setup:
    api_token: str = ""
    workspaces: list = field(default_factory=list)
    automations: list = field(default_factory=list)


def _plan(steps: int) -> list[dict]:
    return [{"step_id": f"s{i}", "action": "transform_data",
             "config": {"output": {"greeting": "Hello {{ inputs.name }} #{{ inputs.n }}"}}}
            for i in range(steps)]  # fmt: skip


def _target(setup: Setup, workspace, steps: int) -> Target:
    from automations import services
    from triggers.models import Trigger
    from triggers.services import trigger_token_rotate

    definition = {
        "schema_version": "1.0", "name": f"bench http {steps} step(s) {uuid.uuid4().hex[:6]}", "plan": _plan(steps),
        "inputs": {"schema": {"type": "object", "properties": {
            "n": {"type": "integer"}, "name": {"type": "string", "default": "bench"}}}},
        "triggers": [{"key": "hook", "type": "webhook", "config": {"rate_limit_per_minute": 100000}}],
        "execution": {"autonomy": "A4", "concurrency": "allow_parallel"},
    }  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition)
    setup.automations.append((workspace, automation))
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation))
    return Target(str(automation.pk), token)


class StatusReader:
    """The observer's own database connection: each poll is one cheap prepared statement, no ORM.

    The figures are client-perceived; what the observer itself costs is not the platform's,
    and on a 2-core machine every microsecond of it (in this process and in the database
    server process answering it) is taken from the system under test. So a poll is a plain
    primary-key lookup, ``SELECT status FROM automations_run WHERE id = …``, prepared once
    (psycopg's server-side prepare on PostgreSQL, sqlite3's statement cache on SQLite), in
    autocommit (no BEGIN/COMMIT round trips), without the ORM's query building and its
    ``ORDER BY created_at`` (``.first()`` adds one). One reader per thread.
    """

    WINDOW = 64  # ids per statement in :meth:`final_among` (fixed, so one prepared statement serves)

    def __init__(self) -> None:
        db = settings.DATABASES["default"]
        self.vendor = connection.vendor
        self.conn: Any
        if self.vendor == "postgresql":
            import psycopg

            params = {"dbname": db["NAME"], "user": db.get("USER") or None, "password": db.get("PASSWORD") or None,
                      "host": db.get("HOST") or None, "port": db.get("PORT") or None}  # fmt: skip
            self.conn = psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True)
            self._one = "SELECT status FROM automations_run WHERE id = %s"
            self._many = "SELECT id, status FROM automations_run WHERE id = ANY(%s) AND status = ANY(%s)"
        elif self.vendor == "sqlite":
            import sqlite3

            self.conn = sqlite3.connect(
                str(db["NAME"]), isolation_level=None, timeout=30, check_same_thread=False
            )
            self._one = "SELECT status FROM automations_run WHERE id = ?"
            marks = ",".join("?" * self.WINDOW)
            final = ",".join(f"'{status}'" for status in FINAL)
            self._many = (
                f"SELECT id, status FROM automations_run WHERE id IN ({marks}) AND status IN ({final})"
            )
        else:
            raise RuntimeError(f"no status reader for {self.vendor}")

    def status(self, run_id: uuid.UUID) -> str | None:
        if self.vendor == "postgresql":
            row = self.conn.execute(self._one, (run_id,), prepare=True).fetchone()
        else:
            row = self.conn.execute(self._one, (run_id.hex,)).fetchone()
        return row[0] if row else None

    def final_among(self, run_ids: list[uuid.UUID]) -> list[tuple[uuid.UUID, str]]:
        """The ids among ``run_ids`` (at most ``WINDOW``) whose run is final, with their status."""
        if self.vendor == "postgresql":
            return self.conn.execute(self._many, (run_ids, list(FINAL)), prepare=True).fetchall()
        padded = [run_id.hex for run_id in run_ids] + [run_ids[0].hex] * (self.WINDOW - len(run_ids))
        return [(uuid.UUID(pk), status) for pk, status in self.conn.execute(self._many, padded)]

    def close(self) -> None:
        self.conn.close()


class Seer:
    """Sees a run final the way a client would: polling its status every ``interval`` seconds.

    ``how="db"`` polls the database (as the issue measured) through a :class:`StatusReader`;
    ``how="api"`` polls ``GET /api/v1/runs/{id}`` over HTTP. One Seer per thread.
    """

    def __init__(self, how: str, port: int, api_token: str, interval: float):
        self.how, self.port, self.api_token, self.interval = how, port, api_token, interval
        self._reader: StatusReader | None = None
        self.polls = 0

    def wait(self, run_id: str, client: Client, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        reader = self._reader
        if self.how != "api" and reader is None:
            reader = self._reader = StatusReader()
        key = uuid.UUID(run_id)
        while time.monotonic() < deadline:
            self.polls += 1
            if self.how == "api":
                _, body = client.request("GET", f"/api/v1/runs/{run_id}", None,
                                         {"Authorization": f"Token {self.api_token}"})  # fmt: skip
                status = json.loads(body).get("status")
            else:
                assert reader is not None
                status = reader.status(key)
            if status in FINAL:
                if status != "succeeded":
                    raise RuntimeError(f"run {run_id} ended {status}")
                return
            time.sleep(self.interval)
        raise RuntimeError(f"run {run_id} not final after {timeout:.0f} s")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def _server_ms(run_ids: list[str], start: str = "created_at") -> list[float]:
    from automations.models import Run

    rows = Run.objects.filter(pk__in=run_ids).values_list(start, "finished_at")
    return [(finished - begun).total_seconds() * 1000 for begun, finished in rows]


def latency(port: int, target: Target, seer: Seer, n: int, *, first: int = 0,
            warm: int = 5) -> tuple[list[float], list[str]]:  # fmt: skip
    client = Client(port)
    for i in range(warm):  # warm every web worker's connection and caches
        seer.wait(target.fire(client, -i), client)
    observed, ids = [], []
    for i in range(first, first + n):
        started = time.perf_counter()
        run_id = target.fire(client, i)
        seer.wait(run_id, client)
        observed.append((time.perf_counter() - started) * 1000)
        ids.append(run_id)
    client.close()
    return observed, ids


BLOCKS = 10


def alternating(port: int, target: Target, seer: Seer, n: int) -> tuple[list[float], list[float], list[str]]:
    """``n`` bare Celery round trips and ``n`` fires → seen final, taken in ``BLOCKS`` alternating
    blocks, so both sides of each ratio see the same minutes: a machine that slows down or speeds up
    during the bench moves both, not only the side measured then. Returns (Celery ms, fire ms, run ids)."""
    celery: list[float] = []
    observed: list[float] = []
    ids: list[str] = []
    for block in range(BLOCKS):
        count = n // BLOCKS + (1 if block < n % BLOCKS else 0)
        celery += celery_round_trips(count, warm=20 if block == 0 else 0)
        block_ms, block_ids = latency(port, target, seer, count, first=len(ids), warm=5 if block == 0 else 0)
        observed += block_ms
        ids += block_ids
    return celery, observed, ids


def traced_latency(port: int, target: Target, seer: Seer, n: int) -> list[dict[str, float]]:
    """``n`` fires, one at a time, each with every stage's stamp (see :mod:`bench.trace`)."""
    from automations.models import Run

    directory = trace.trace_dir()
    client = Client(port)
    for i in range(5):
        seer.wait(target.fire(client, -i), client)
    clients: dict[str, dict[str, float]] = {}
    for i in range(n):
        key = uuid.uuid4().hex
        stamps = clients[key] = {"client.send": time.time()}
        run_id = target.fire(client, i, trace_key=key)
        stamps["client.response"] = time.time()
        seer.wait(run_id, client)
        stamps["client.seen"] = time.time()
    client.close()
    time.sleep(0.5)  # the last postrun stamp is written after the run is final
    server = trace.load(directory)
    merged = [{**server.get(key, {}), **stamps} for key, stamps in clients.items()]
    rows = Run.objects.filter(pk__in=[t["run"] for t in merged if "run" in t])
    times = {str(pk): (started, finished) for pk, started, finished in
             rows.values_list("pk", "started_at", "finished_at")}  # fmt: skip
    for stamps in merged:
        started, finished = times.get(str(stamps.pop("run", "")), (None, None))
        if started is not None:
            stamps["row.started_at"] = started.timestamp()
        if finished is not None:
            stamps["row.finished_at"] = finished.timestamp()
    return merged


COMPLETION_POLL = 0.020  # seconds between two polls of the throughput figure's completion wait


def wait_final(
    run_ids: list[str],
    *,
    interval: float = COMPLETION_POLL,
    timeout: float = 600,
    reader: StatusReader | None = None,
) -> tuple[int, int]:
    """Waits until every run of ``run_ids`` is final; returns (runs seen final, how many of them not succeeded).

    Runs finish roughly in the order they were fired, so each poll asks only about the
    oldest pending ones (one statement over at most ``StatusReader.WINDOW`` ids); while a
    whole window is final the next one is asked at once, so the backlog is walked without
    sleeping. Between polls it sleeps ``interval``: the last run is seen final at most
    ``interval`` + one statement (well under a millisecond) after it is, so over a
    multi-second figure the end time is accurate to about +20 ms (always late, never early),
    and the observer's cost is a few statements per 20 ms instead of one statement over 500
    ids every 5 ms.
    """
    own = reader is None
    reader = reader or StatusReader()
    pending = [uuid.UUID(run_id) for run_id in run_ids]
    seen = bad = 0
    deadline = time.monotonic() + timeout
    try:
        while pending and time.monotonic() < deadline:
            window = pending[: reader.WINDOW]
            done = dict(reader.final_among(window))
            if done:
                seen += len(done)
                bad += sum(status != "succeeded" for status in done.values())
                pending = [run_id for run_id in window if run_id not in done] + pending[reader.WINDOW :]
            if pending and len(done) < len(window):
                time.sleep(interval)
    finally:
        if own:
            reader.close()
    return seen, bad


def throughput(port: int, targets: list[Target], runs: int, clients: int) -> dict[str, float]:
    """``runs`` fires from ``clients`` threads (client i fires at ``targets[i % len]``), waits for all final."""
    counter = iter(range(runs))
    lock = threading.Lock()
    ids: list[str] = []
    errors = [0]

    def loop(index: int) -> None:
        client = Client(port)
        target = targets[index % len(targets)]
        try:
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                try:
                    run_id = target.fire(client, i)
                except Exception:
                    with lock:
                        errors[0] += 1
                    continue
                with lock:
                    ids.append(run_id)
        finally:
            client.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(loop, range(clients)))
    fired = time.perf_counter() - started
    seen, bad = wait_final(ids)
    elapsed = time.perf_counter() - started
    errors[0] += bad + len(ids) - seen
    close_old_connections()
    return {"runs_per_s": len(ids) / elapsed, "fires_per_s": len(ids) / fired, "errors": errors[0]}


def audit_writers(processes: int = 4, events: int = 2000, batch: int = 10) -> tuple[float, float, str]:
    """Appends/s from ``processes`` writers of one chain (``batch`` events a transaction), then sequencing/s."""
    from audit.sequencer import sequence_pending
    from bench import audit_append

    base = audit_append.BENCH_WORKSPACE_BASE + int.from_bytes(os.urandom(3)) * 100
    rate, _ = audit_append._run("http", [base] * processes, events, batch)
    started = time.perf_counter()
    sequenced = sequence_pending()
    sequencing = sequenced / (time.perf_counter() - started)
    return rate, sequencing, audit_append._verify([base])


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, figure: str, measured: str, ratio: str = "", target: str = "") -> None:
        self.rows.append((figure, measured, ratio, target))
        print(f"  {figure}: {measured}  {ratio}  {target}".rstrip(), flush=True)

    def markdown(self) -> str:
        lines = ["| figure | measured | ratio | target |", "| --- | --- | --- | --- |"]
        lines += [f"| {' | '.join(row)} |" for row in self.rows]
        return "\n".join(lines)


def _ok(flag: bool) -> str:
    return "met" if flag else "NOT met"


def run(*, n: int, runs: int, web_workers: int, concurrency: dict[str, int], see: str, poll_ms: float,
        skip: list[str], out: Callable[[str], None], traced: bool = False) -> Table:  # fmt: skip
    from workspaces.models import Role
    from workspaces.services import api_token_create, workspace_get_or_create

    slug = f"bench-http-{uuid.uuid4().hex[:6]}"
    setup = Setup()
    main_ws = workspace_get_or_create(slug=slug)
    setup.api_token = api_token_create(username=f"{slug}-user", workspace_slug=slug, role=Role.OPERATOR)
    one = _target(setup, main_ws, 1)
    ten = _target(setup, main_ws, 10)
    spread = [one] + [_target(setup, workspace_get_or_create(slug=f"{slug}-{i}"), 1) for i in range(1, 8)]
    connection.close()  # the children must not inherit anything; the threads open their own

    table = Table()
    if traced:
        trace.clear(trace.trace_dir())
    with Topology(web_workers=web_workers, concurrency=concurrency, traced=traced) as topology:
        out(f"starting the up topology on port {topology.port} ({web_workers} web workers, {concurrency})")
        topology.wait_ready()
        seer = Seer(see, topology.port, setup.api_token, poll_ms / 1000)
        celery, observed, ids = alternating(topology.port, one, seer, n)
        c50, c99 = pct(celery, 0.5), pct(celery, 0.99)
        out(f"bare celery round trip: p50 {c50:.2f} ms, p99 {c99:.2f} ms (n={n}, in {BLOCKS} blocks "
            f"alternating with the fires')")  # fmt: skip
        drain = celery_drain(n * 2)
        out(f"bare celery drain: {drain:.0f} tasks/s")
        table.add("bare Celery round trip", f"p50 {c50:.2f} ms, p99 {c99:.2f} ms", "1×")
        table.add("bare Celery drain", f"{drain:.0f} tasks/s", "1×")
        o50, o99 = pct(observed, 0.5), pct(observed, 0.99)
        table.add(f"fire → seen succeeded over HTTP (client, {see} poll {poll_ms:g} ms), p50",
                  f"{o50:.2f} ms", f"{o50 / c50:.2f}× Celery p50", f"≤ 4× ({_ok(o50 <= 4 * c50)}); aim ≤ 3×")  # fmt: skip
        table.add(
            "same, p99", f"{o99:.2f} ms", f"{o99 / c99:.2f}× Celery p99", f"≤ 5× ({_ok(o99 <= 5 * c99)})"
        )
        server = _server_ms(ids)
        s50, s99 = pct(server, 0.5), pct(server, 0.99)
        table.add("run's own created_at → finished_at", f"p50 {s50:.2f} ms, p99 {s99:.2f} ms",
                  f"{s50 / c50:.2f}× p50, {s99 / c99:.2f}× p99")  # fmt: skip

        if traced:
            out(f"\nwhere the time of one fire → final goes (p50 of each segment over {n} traced fires):")
            cpu = topology.web_cpu_seconds()
            traces = traced_latency(topology.port, one, seer, n)
            cpu = topology.web_cpu_seconds() - cpu
            for pair, label, p50, samples in trace.segments(traces):
                out(f"  {p50:8.2f} ms  {label}  [{pair}{'' if samples == n else f', {samples} samples'}]")
            out(f"  web server CPU per fire (its processes' user + system time over these fires, polls "
                f"included when --see api): {cpu / n * 1000:.2f} ms")  # fmt: skip
            out("")

        if "throughput" not in skip:
            for clients in (8, 32):
                result = throughput(topology.port, [one], runs, clients)
                rate = result["runs_per_s"]
                target = f"≥ 0.25× ({_ok(rate >= 0.25 * drain and not result['errors'])}); aim ≥ 0.5×"
                table.add(f"sustained one-step runs/s through fire, {clients} HTTP clients",
                          f"{rate:.1f} runs/s ({result['errors']} errors; fires accepted {result['fires_per_s']:.0f}/s)",
                          f"{rate / drain:.3f}× drain", target if clients == 8 else "")  # fmt: skip
                if clients == 8:
                    single = rate

        if "slope" not in skip:
            _, one_ids = latency(topology.port, one, seer, max(20, n // 4))
            _, ten_ids = latency(topology.port, ten, seer, max(20, n // 4))
            slope = (
                pct(_server_ms(ten_ids, "started_at"), 0.5) - pct(_server_ms(one_ids, "started_at"), 0.5)
            ) / 9
            table.add("each extra transform_data step (10- vs 1-step, started → finished)", f"{slope:.2f} ms",
                      f"{slope / c50:.2f}× Celery p50", f"≤ 0.5× ({_ok(slope <= 0.5 * c50)})")  # fmt: skip

        if "workspaces" not in skip and "throughput" not in skip:
            result = throughput(topology.port, spread, runs, 8)
            rate = result["runs_per_s"]
            table.add("runs/s, 8 clients over 8 workspaces", f"{rate:.1f} runs/s ({result['errors']} errors)")
            table.add("runs/s, one workspace / 8 workspaces", f"{single:.1f} / {rate:.1f}",
                      f"{single / rate:.2f}×", f"≥ 0.9× ({_ok(single >= 0.9 * rate)})")  # fmt: skip

    seer.close()
    if "audit" not in skip:
        rate, sequencing, verified = audit_writers()
        table.add(f"audit appends/s, 4 writer processes, one chain, 10 per transaction ({connection.vendor})",
                  f"{rate:.0f}/s; then sequenced at {sequencing:.0f}/s", verified,
                  f"≥ 5,000 ({_ok(rate >= 5000)}); aim ≥ 10,000")  # fmt: skip
    return table
