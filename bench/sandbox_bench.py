"""Sandbox benchmarks (SPEC §8, docs/sandbox.md): what a code step costs.

* ``bench_sandbox_overhead(n)`` -- p50 of a trivial ``run_python`` step's handler call
  (workspace files, bubblewrap, prlimit, python3, envelope) against the same program
  run directly with ``subprocess``; no database, no workers.
* ``bench_fast_queue_sandboxed(n)`` -- one-step ``run_python`` automations per second
  through live workers on ``automations_fast`` (start them first, or pass
  ``--start-workers`` below).

``manage.py bench`` calls both; standalone (after ``manage.py migrate``)::

    uv run python bench/sandbox_bench.py                      # overhead only
    uv run python bench/sandbox_bench.py --runs 200 --start-workers
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRIVIAL = "import json, sys\nprint(json.dumps({'n': json.load(sys.stdin)['n'] + 1}))\n"
AUTOMATION_NAME = "bench sandboxed 1 step"
BASELINE_NAME = "bench transform 1 step"
FINAL = ("succeeded", "failed", "cancelled", "timed_out", "needs_attention")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def _report(report: Any, key: str, value: float, text: str) -> None:
    if report is not None:
        report.add(key, value, text)  # bench.engine_bench.Report prints it
    else:
        print(text, flush=True)


def bench_sandbox_overhead(n: int = 50, *, report: Any = None) -> dict[str, float]:
    """p50/p95 (ms) of the sandboxed step vs the same code run directly, interleaved."""
    from capabilities.base import ActionContext
    from capabilities.builtin import code

    ctx = ActionContext(run_id="bench", step_id="trivial", attempt=1, workspace_id=0, trace_id="bench",
                        idempotency_key="bench", timeout_seconds=30)  # fmt: skip
    config = {"code": TRIVIAL, "input": {"n": 1}}
    direct, sandboxed = [], []
    with tempfile.TemporaryDirectory() as workdir:
        Path(workdir, code.PYTHON_MAIN).write_text(TRIVIAL)
        argv = [code.PYTHON, *code.PYTHON_FLAGS, code.PYTHON_MAIN]
        for i in range(n + 3):  # interleaved, so other load on the host hits both alike; 3 warm-ups
            started = time.perf_counter()
            out = subprocess.run(argv, cwd=workdir, input=b'{"n": 1}', capture_output=True, check=True).stdout
            elapsed_direct = time.perf_counter() - started
            started = time.perf_counter()
            envelope = code.RUN_PYTHON.handler(ctx, config)
            elapsed_sandboxed = time.perf_counter() - started
            if not envelope.ok or envelope.data != {"n": 2} or out.strip() != b'{"n": 2}':
                raise RuntimeError(f"the trivial step failed: {envelope.as_dict()!r}")
            if i >= 3:
                direct.append(elapsed_direct * 1000)
                sandboxed.append(elapsed_sandboxed * 1000)
    figures = {
        "sandbox_direct_p50_ms": statistics.median(direct),
        "sandbox_step_p50_ms": statistics.median(sandboxed),
        "sandbox_step_p95_ms": _pct(sandboxed, 0.95),
    }
    overhead = figures["sandbox_step_p50_ms"] - figures["sandbox_direct_p50_ms"]
    figures["sandbox_overhead_p50_ms"] = overhead
    _report(report, "sandbox_overhead_p50_ms", overhead,
            f"trivial run_python step (n={n}): sandboxed p50 {figures['sandbox_step_p50_ms']:.1f} ms, "
            f"p95 {figures['sandbox_step_p95_ms']:.1f} ms; same code run directly p50 "
            f"{figures['sandbox_direct_p50_ms']:.1f} ms; sandbox overhead {overhead:.1f} ms")  # fmt: skip
    return figures


def _automation(workspace, *, sandboxed: bool = True):
    from automations import services
    from automations.models import Automation

    name = AUTOMATION_NAME if sandboxed else BASELINE_NAME
    existing = Automation.objects.filter(workspace=workspace, name=name).first()
    if existing is not None:
        return existing
    if sandboxed:
        step = {"step_id": "add", "action": "run_python",
                "config": {"code": TRIVIAL, "input": {"n": "{{ inputs.n }}"}}}  # fmt: skip
    else:
        step = {
            "step_id": "add",
            "action": "transform_data",
            "config": {"output": {"n": "{{ inputs.n + 1 }}"}},
        }
    definition = {"schema_version": "1.0", "name": name, "plan": [step],
                  "inputs": {"schema": {"type": "object", "properties": {"n": {"type": "integer", "default": 0}}}},
                  "execution": {"concurrency": "allow_parallel"}}  # fmt: skip
    return services.automation_create(workspace=workspace, definition=definition)


def _wait(run_ids: list[str], timeout: float) -> None:
    from automations.models import Run

    pending = set(run_ids)
    deadline = time.monotonic() + timeout
    while pending:
        done = Run.objects.filter(pk__in=list(pending), status__in=FINAL).values_list("pk", flat=True)
        pending -= {str(pk) for pk in done}
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"{len(pending)} sandboxed runs did not finish in {timeout:.0f} s")
        time.sleep(0.01)


def _drain(automation, n: int, timeout: float) -> tuple[float, list[float], int]:
    """Dispatch ``n`` runs as fast as possible; (runs/s, created → finished ms, failures)."""
    from automations.models import Run
    from automations.services import run_create
    from config.celery import QUEUE_FAST

    warm = [str(run_create(automation=automation, inputs={"n": i}).run.pk) for i in range(4)]
    _wait(warm, timeout=120)
    started = time.perf_counter()
    ids = []
    for i in range(n):
        run = run_create(automation=automation, inputs={"n": i}).run
        if run.queue != QUEUE_FAST:
            raise RuntimeError(f"a default one-step run should be on {QUEUE_FAST}, not {run.queue}")
        ids.append(str(run.pk))
    _wait(ids, timeout=timeout)
    elapsed = time.perf_counter() - started
    rows = list(Run.objects.filter(pk__in=ids).values_list("status", "created_at", "finished_at"))
    failed = sum(1 for status, _, _ in rows if status != "succeeded")
    return n / elapsed, [(done - created).total_seconds() * 1000 for _, created, done in rows], failed


def bench_fast_queue_sandboxed(
    n: int = 200, *, report: Any = None, timeout: float = 600.0, baseline: bool = False
) -> dict[str, float]:
    """Sustained one-step run_python runs/s through the workers consuming automations_fast.

    ``baseline``: first the same number of one-step ``transform_data`` runs, for the ratio.
    """
    from workspaces.services import workspace_get_or_create

    workspace = workspace_get_or_create(slug="bench")
    figures: dict[str, float] = {}
    if baseline:
        rate, latencies, _ = _drain(_automation(workspace, sandboxed=False), n, timeout)
        figures.update(transform_runs_per_s=rate, transform_run_p50_ms=_pct(latencies, 0.5))
    rate, latencies, failed = _drain(_automation(workspace), n, timeout)
    figures.update(
        sandboxed_runs_per_s=rate,
        sandboxed_run_p50_ms=_pct(latencies, 0.5),
        sandboxed_run_p95_ms=_pct(latencies, 0.95),
        sandboxed_runs_failed=float(failed),
    )
    versus = (
        f"; transform_data runs {figures['transform_runs_per_s']:.1f} runs/s, p50 "
        f"{figures['transform_run_p50_ms']:.0f} ms = {rate / figures['transform_runs_per_s']:.2f}x"
        if baseline else ""
    )  # fmt: skip
    _report(report, "sandboxed_runs_per_s", rate,
            f"one-step run_python runs on automations_fast ({n} runs): {rate:.1f} runs/s, created → finished "
            f"p50 {figures['sandboxed_run_p50_ms']:.0f} ms, p95 {figures['sandboxed_run_p95_ms']:.0f} ms, "
            f"{failed} failed{versus}")  # fmt: skip
    return figures


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=50, help="samples for the overhead figure")
    parser.add_argument("--runs", type=int, default=0, help="runs for the fast-queue figure (0: skip it)")
    parser.add_argument("--start-workers", action="store_true", help="start automations_fast workers first")
    parser.add_argument("--concurrency", type=int, default=2, help="with --start-workers")
    parser.add_argument("--baseline", action="store_true", help="also time one-step transform_data runs")
    args = parser.parse_args(argv)

    sys.path.insert(0, str(REPO))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    bench_sandbox_overhead(args.n)
    if not args.runs:
        return
    if not args.start_workers:
        bench_fast_queue_sandboxed(args.runs, baseline=args.baseline)
        return
    from bench.workers import Workers

    with Workers({"automations_fast": args.concurrency}) as workers:
        workers.wait_ready()
        bench_fast_queue_sandboxed(args.runs, baseline=args.baseline)


if __name__ == "__main__":
    main()
