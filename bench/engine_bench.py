"""Engine benchmarks against a bare Celery round trip on the same broker (SPEC §13).

Run with ``uv run manage.py bench`` (it starts its own workers on the configured
database and broker). Every figure is printed with its ratio to the baseline
measured in the same invocation.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.db import close_old_connections

# How often .get() polls a result backend that must be polled (the embedded lane's SQLite
# backend; Redis answers by pub/sub): Celery's default 0.5 s would be the baseline's p50.
POLL = 0.002
FINAL = ("succeeded", "failed", "cancelled", "timed_out", "needs_attention")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def add(self, key: str, value: float, text: str) -> None:
        self.figures[key] = value
        self.lines.append(text)
        print(text, flush=True)


def celery_round_trips(n: int, *, warm: int = 20) -> list[float]:
    """``n`` bare Celery no-op round trips (``apply_async().get()`` on the fast queue), in ms."""
    from config.celery import QUEUE_FAST, ping

    for _ in range(warm):
        ping.apply_async(queue=QUEUE_FAST).get(timeout=10, interval=POLL)
    latencies = []
    for _ in range(n):
        t = time.perf_counter()
        ping.apply_async(queue=QUEUE_FAST).get(timeout=10, interval=POLL)
        latencies.append((time.perf_counter() - t) * 1000)
    return latencies


def celery_drain(tasks: int) -> float:
    """Tasks/s when ``tasks`` no-op tasks are sent at once and all their results awaited."""
    from config.celery import QUEUE_FAST, ping

    t = time.perf_counter()
    results = [ping.apply_async(queue=QUEUE_FAST) for _ in range(tasks)]
    for result in results:
        result.get(timeout=60, interval=POLL)
    return tasks / (time.perf_counter() - t)


def celery_baseline(report: Report, n: int) -> None:
    latencies = celery_round_trips(n)
    report.add("celery_p50_ms", pct(latencies, 0.5), f"bare celery round trip: p50 {pct(latencies, 0.5):.2f} ms, "
               f"p99 {pct(latencies, 0.99):.2f} ms (n={n})")  # fmt: skip
    report.figures["celery_p99_ms"] = pct(latencies, 0.99)
    rate = celery_drain(n * 2)
    report.add("celery_drain_per_s", rate, f"bare celery drain: {rate:.0f} tasks/s")


def _automation(workspace, name: str, steps: int):
    from automations import services
    from automations.models import Automation

    existing = Automation.objects.filter(workspace=workspace, name=name).first()
    if existing:
        return existing
    plan = [{"step_id": f"s{i}", "action": "transform_data", "config": {"output": {"i": i, "n": "{{ inputs.n }}"}}}
            for i in range(steps)]  # fmt: skip
    definition = {"schema_version": "1.0", "name": name, "plan": plan,
                  "inputs": {"schema": {"type": "object", "properties": {"n": {"type": "integer", "default": 0}}}},
                  "execution": {"concurrency": "allow_parallel"}}  # fmt: skip
    return services.automation_create(workspace=workspace, definition=definition)


def _wait(run_ids: list[str], timeout: float = 120.0) -> None:
    from automations.models import Run

    pending = set(run_ids)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        done = set(Run.objects.filter(pk__in=list(pending), status__in=FINAL).values_list("pk", flat=True))
        pending -= {str(pk) for pk in done}
        if pending:
            time.sleep(0.002)
    if pending:
        raise RuntimeError(f"{len(pending)} runs did not finish")


def _server_latencies(run_ids: list[str]) -> tuple[list[float], list[float]]:
    from automations.models import Run

    total, execute = [], []
    for created, started, finished in Run.objects.filter(pk__in=run_ids).values_list(
        "created_at", "started_at", "finished_at"
    ):
        total.append((finished - created).total_seconds() * 1000)
        execute.append((finished - started).total_seconds() * 1000)
    return total, execute


def manual_runs(report: Report, client_factory: Callable, automation, n: int) -> None:
    client = client_factory()
    url = f"/api/v1/automations/{automation.pk}/run"
    client.post(url, {"n": -1}, format="json")
    observed, ids = [], []
    for i in range(n):
        t = time.perf_counter()
        run_id = client.post(url, {"n": i}, format="json").json()["run_id"]
        _wait([run_id])
        observed.append((time.perf_counter() - t) * 1000)
        ids.append(run_id)
    server, _ = _server_latencies(ids)
    base = report.figures["celery_p50_ms"]
    report.add("run_p50_ms", pct(observed, 0.5),
               f"manual run → succeeded (client): p50 {pct(observed, 0.5):.2f} ms, p95 {pct(observed, 0.95):.2f} ms "
               f"= {pct(observed, 0.5) / base:.2f}x celery p50")  # fmt: skip
    report.add("run_server_p50_ms", pct(server, 0.5),
               f"manual run created_at → finished_at: p50 {pct(server, 0.5):.2f} ms, p99 {pct(server, 0.99):.2f} ms "
               f"= {pct(server, 0.5) / base:.2f}x celery p50, p99 {pct(server, 0.99) / report.figures['celery_p99_ms']:.2f}x")  # fmt: skip


def throughput(report: Report, client_factory: Callable, automation, n: int, clients: int = 8) -> None:
    url = f"/api/v1/automations/{automation.pk}/run"
    ids: list[str] = []
    lock = threading.Lock()

    def fire(count: int) -> None:
        client = client_factory()
        for i in range(count):
            response = client.post(url, {"n": i}, format="json")
            if response.status_code != 202:
                raise RuntimeError(f"run refused: {response.status_code} {response.content[:200]}")
            with lock:
                ids.append(response.json()["run_id"])
        close_old_connections()

    t = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(fire, [n // clients] * clients))
    _wait(ids, timeout=600)
    rate = len(ids) / (time.perf_counter() - t)
    ratio = rate / report.figures["celery_drain_per_s"]
    report.add("runs_per_s", rate, f"sustained one-step runs ({clients} clients, {len(ids)} runs): {rate:.0f} runs/s "
               f"= {ratio:.2f}x celery drain rate")  # fmt: skip


def step_slope(report: Report, client_factory: Callable, automations: dict[int, object], n: int) -> None:
    client = client_factory()
    medians = {}
    for steps, automation in automations.items():
        ids = []
        for i in range(n):
            run_id = client.post(f"/api/v1/automations/{automation.pk}/run", {"n": i}, format="json").json()[
                "run_id"
            ]
            _wait([run_id])
            ids.append(run_id)
        _, execute = _server_latencies(ids)
        medians[steps] = statistics.median(execute)
        print(f"  {steps:>2}-step plan: started → finished p50 {medians[steps]:.2f} ms", flush=True)
    slope = (medians[max(medians)] - medians[min(medians)]) / (max(medians) - min(medians))
    base = report.figures["celery_p50_ms"]
    report.add("step_slope_ms", slope, f"per extra step: {slope:.3f} ms = {slope / base:.2f}x celery p50; "
               f"40-step plan {medians[max(medians)]:.1f} ms")  # fmt: skip


def queue_isolation(
    report: Report, client_factory: Callable, automation, n: int, backlog: int = 2000
) -> None:
    from automations.models import Run
    from config.celery import QUEUE_LONG, app

    client = client_factory()

    def trigger_to_start() -> list[float]:
        values = []
        for i in range(n):
            run_id = client.post(f"/api/v1/automations/{automation.pk}/run", {"n": i}, format="json").json()[
                "run_id"
            ]
            _wait([run_id])
            created, started = Run.objects.filter(pk=run_id).values_list("created_at", "started_at").get()
            values.append((started - created).total_seconds() * 1000)
        return values

    idle = pct(trigger_to_start(), 0.5)
    for _ in range(backlog):
        app.send_task("autoplane.sleep", args=[0.5], queue=QUEUE_LONG)
    busy = pct(trigger_to_start(), 0.5)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(QUEUE_LONG)
    report.add("isolation_ratio", busy / idle, f"queue isolation: trigger → start p50 idle {idle:.2f} ms, with "
               f"{backlog} tasks on the long queue {busy:.2f} ms = {busy / idle:.2f}x idle")  # fmt: skip


def webhook(report: Report, n: int) -> None:
    from bench.triggers_bench import bench_webhook_fire

    result = bench_webhook_fire(n, clients=8)
    server, client = result["latency"]["server"], result["latency"]["client"]
    base50, base99 = report.figures["celery_p50_ms"], report.figures["celery_p99_ms"]
    report.add("webhook_p50_ms", server["p50_ms"], f"webhook fire → succeeded (created_at → finished_at): p50 "
               f"{server['p50_ms']:.2f} ms = {server['p50_ms'] / base50:.2f}x celery p50, p99 {server['p99_ms']:.2f} ms = "
               f"{server['p99_ms'] / base99:.2f}x celery p99; polling client p50 {client['p50_ms']:.2f} ms")  # fmt: skip
    throughput = result["throughput"]
    rate = throughput["runs_per_second"] or 0.0
    report.add("webhook_runs_per_s", rate, f"webhook sustained (8 clients, {throughput['fired']} fires, "
               f"{throughput['errors']} errors): {rate:.0f} runs/s = "
               f"{rate / report.figures['celery_drain_per_s']:.2f}x celery drain rate")  # fmt: skip


def event_matching(report: Report) -> None:
    from bench.triggers_bench import bench_event_matching, bench_filter_worst_case

    result = bench_event_matching(subscribed=10, unsubscribed=10000)
    levels = ", ".join(
        f"{count} others: p50 {summary['p50_ms']:.3f} ms" for count, summary in result["levels"].items()
    )
    report.add("event_matching_growth", result["growth"] or 0.0,
               f"event matching with 10 subscribers ({levels}); growth {result['growth']}x")  # fmt: skip
    worst = bench_filter_worst_case()
    report.add("filter_worst_case_max_ms", worst["worst_max_ms"],
               "worst accepted filter against a 64 KB event, CPU per evaluation: " + ", ".join(
                   f"{name}: p50 {c['p50_ms']:.3f} ms, max {c['max_ms']:.3f} ms"
                   for name, c in worst["candidates"].items()))  # fmt: skip
