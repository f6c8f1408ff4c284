"""Cancel latency (issue 10): live cancels of a ``run_python`` step sleeping in its sandbox.

For each sample: a run whose one step sleeps 60 s in the sandbox is started on a
real worker; once the step shows ``running`` and its sandbox process exists, it
is cancelled the way the API does (``services.run_cancel``), and two times are
taken from that moment: until the worker wrote the run ``cancelled`` (its
``finished_at``, so the poll interval does not count), and until no process of
the sandbox is left (``pgrep``, polled every 10 ms). Samples run one after the other. The watch reads the cancel
flag every ``CANCEL_POLL_SECONDS`` (0.5 s), so about a quarter second is the
expected median.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Callable

from django.db import transaction
from django.utils import timezone

from automations import services
from automations.models import Run, RunStatus, StepRun, StepStatus
from bench.engine_bench import pct
from workspaces.services import workspace_get_or_create

POLL = 0.01


def _until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL)


def _sandbox_pids(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


def _automation(marker: str):
    workspace = workspace_get_or_create(slug="bench")
    return services.automation_create(workspace=workspace, definition={
        "schema_version": "1.0", "name": f"bench cancel {marker}",
        "plan": [{"step_id": "nap", "action": "run_python", "timeout_seconds": 120,
                  "config": {"code": f"import subprocess\nsubprocess.run(['sh', '-c', 'sleep 60 # {marker}'])"}}],
        "execution": {"autonomy": "A4"},
    })  # fmt: skip


def _sample(automation, marker: str) -> tuple[float, float]:
    """One live cancel: (ms until the run was written cancelled, ms until its sandbox process was gone)."""
    run = services.run_create(automation=automation, inputs={}).run
    assert run is not None  # a manual run is never deduplicated
    _until(lambda: StepRun.objects.filter(run=run, status=StepStatus.RUNNING).exists(), 60, "step running")
    _until(lambda: _sandbox_pids(marker), 60, "the sandbox process")
    cancelled_at = timezone.now()
    started = time.monotonic()
    with transaction.atomic():
        services.run_cancel(run=run)
    _until(lambda: not _sandbox_pids(marker), 30, "the sandbox process to go")
    gone_ms = (time.monotonic() - started) * 1000
    _until(lambda: Run.objects.filter(pk=run.pk, status=RunStatus.CANCELLED).exists(), 30, "run cancelled")
    finished_at = Run.objects.values_list("finished_at", flat=True).get(pk=run.pk)
    step = StepRun.objects.get(run=run)
    if step.status != StepStatus.CANCELLED or finished_at is None:
        raise RuntimeError(f"run {run.pk}: the step ended {step.status}, not cancelled")
    return (finished_at - cancelled_at).total_seconds() * 1000, gone_ms


def run(n: int, out: Callable[[str], None] = print) -> dict[str, float]:
    """``n`` live cancels (workers must be consuming every queue); returns the figures in ms."""
    marker = f"cancelbench{uuid.uuid4().hex[:12]}"
    automation = _automation(marker)
    to_final: list[float] = []
    to_gone: list[float] = []
    for i in range(n):
        final_ms, gone_ms = _sample(automation, marker)
        to_final.append(final_ms)
        to_gone.append(gone_ms)
        out(
            f"  cancel {i + 1}/{n}: run cancelled after {final_ms:.0f} ms, sandbox gone after {gone_ms:.0f} ms"
        )
    figures = {
        "cancel_to_cancelled_p50_ms": pct(to_final, 0.5),
        "cancel_to_cancelled_max_ms": max(to_final),
        "cancel_to_sandbox_gone_p50_ms": pct(to_gone, 0.5),
        "cancel_to_sandbox_gone_max_ms": max(to_gone),
    }
    out(f"cancel latency over {n} live cancels of a sleeping run_python step: run cancelled p50 "
        f"{figures['cancel_to_cancelled_p50_ms']:.0f} ms, max {figures['cancel_to_cancelled_max_ms']:.0f} ms; "
        f"sandbox gone p50 {figures['cancel_to_sandbox_gone_p50_ms']:.0f} ms, "
        f"max {figures['cancel_to_sandbox_gone_max_ms']:.0f} ms")  # fmt: skip
    return figures
