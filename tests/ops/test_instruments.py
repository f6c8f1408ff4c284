"""config/instruments.py keeps each metric's labelled child: counts still land in the right series."""

from __future__ import annotations

from prometheus_client import REGISTRY

from config import instruments


def _value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_repeated_counts_add_up_in_their_own_series():
    labels = {"status": "succeeded", "queue": "wcpu2-test-queue"}
    before_runs = _value("autoplane_runs_finished_total", **labels)
    before_durations = _value("autoplane_run_duration_seconds_count", **labels)
    before_failed = _value("autoplane_runs_finished_total", status="failed", queue="wcpu2-test-queue")
    for _ in range(3):
        instruments.run_finished(
            status="succeeded", queue="wcpu2-test-queue", created_at=None, finished_at=None
        )
    instruments.run_finished(status="failed", queue="wcpu2-test-queue", created_at=None, finished_at=None)
    assert _value("autoplane_runs_finished_total", **labels) == before_runs + 3
    # The histogram with the same label values is another metric: nothing observed without a duration.
    assert _value("autoplane_run_duration_seconds_count", **labels) == before_durations
    assert (
        _value("autoplane_runs_finished_total", status="failed", queue="wcpu2-test-queue")
        == before_failed + 1
    )
