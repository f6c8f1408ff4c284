"""``bench --cancel N``: live cancels of a sleeping sandbox step, each ending ``cancelled`` with its process gone."""

from __future__ import annotations

import pytest

from automations.models import Run, RunStatus, StepRun
from bench import cancel_bench
from capabilities.sandbox import BubblewrapBackend


def test_two_live_cancels_are_timed(celery_workers):
    if not BubblewrapBackend().available():
        pytest.skip("bubblewrap cannot start a sandbox here")
    lines: list[str] = []

    figures = cancel_bench.run(2, out=lines.append)

    assert set(figures) == {"cancel_to_cancelled_p50_ms", "cancel_to_cancelled_max_ms",
                            "cancel_to_sandbox_gone_p50_ms", "cancel_to_sandbox_gone_max_ms"}  # fmt: skip
    assert 0 < figures["cancel_to_cancelled_p50_ms"] <= figures["cancel_to_cancelled_max_ms"]
    assert list(Run.objects.values_list("status", flat=True)) == [RunStatus.CANCELLED] * 2
    assert list(StepRun.objects.values_list("status", flat=True)) == ["cancelled"] * 2
    assert lines[-1].startswith("cancel latency over 2 live cancels")
