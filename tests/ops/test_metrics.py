"""/metrics the way Prometheus reads it: cumulative ``_total`` counters and histograms counted where
things happen, summed over processes in multiprocess mode, and gauges that stay bounded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from automations import services
from automations.models import Run, RunStatus
from config.celery import QUEUES
from ops.management.commands.up import build_specs, fresh_metrics_dir, metrics_dir_for
from ops.metrics import build_registry
from tests.factories import definition, transform
from tests.live import REPO, live_worker_env
from workspaces.services import workspace_get_or_create


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape, keyed by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(scraped: dict, name: str, **labels) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels`` (0 when there are none)."""
    return sum(v for (n, ls), v in scraped.items() if n == name and set(labels.items()) <= set(ls))


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200
    return samples(response.content.decode())


@pytest.fixture
def no_publish(monkeypatch):
    """The test drives runs in-process: no execute_run message goes to the broker."""
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


def _automation(workspace, *steps, name="metered"):
    return services.automation_create(workspace=workspace, definition=definition(*steps, name=name))


def test_a_finished_run_counts_once_and_the_counts_survive_scrapes(client, workspace, drive, no_publish):
    automation = _automation(workspace, transform("a", {"x": 1}, output_as="a"), transform("b", "done"))
    before = scrape(client)

    run = drive(services.run_create(automation=automation, inputs={}).run.pk)
    assert run.status == RunStatus.SUCCEEDED
    first, second = scrape(client), scrape(client)

    for after in (first, second):  # a scrape reads the counters, never resets them
        assert value(after, "autoplane_runs_finished_total", status="succeeded", queue=run.queue) == (
            value(before, "autoplane_runs_finished_total", status="succeeded", queue=run.queue) + 1
        )
        assert value(after, "autoplane_fires_total", trigger_type="manual", result="created") == (
            value(before, "autoplane_fires_total", trigger_type="manual", result="created") + 1
        )
        assert value(after, "autoplane_steps_total", action="transform_data", outcome="succeeded") == (
            value(before, "autoplane_steps_total", action="transform_data", outcome="succeeded") + 2
        )
        assert value(after, "autoplane_run_duration_seconds_count", status="succeeded") == (
            value(before, "autoplane_run_duration_seconds_count", status="succeeded") + 1
        )
        assert value(after, "autoplane_run_duration_seconds_bucket", status="succeeded", le="+Inf") == (
            value(before, "autoplane_run_duration_seconds_bucket", status="succeeded", le="+Inf") + 1
        )
        assert value(after, "autoplane_step_duration_seconds_count", action="transform_data") == (
            value(before, "autoplane_step_duration_seconds_count", action="transform_data") + 2
        )
        assert value(after, "autoplane_run_queue_wait_seconds_count", queue=run.queue) == (
            value(before, "autoplane_run_queue_wait_seconds_count", queue=run.queue) + 1
        )


def test_a_retried_step_and_a_failed_run_are_counted(client, workspace, drive, no_publish):
    failing = {"step_id": "boom", "action": "http_request", "max_retries": 1, "retry_backoff": "none",
               "config": {"method": "GET", "url": "http://127.0.0.1:9/unreachable"}}  # fmt: skip
    automation = _automation(workspace, failing, name="failing")
    before = scrape(client)

    run = drive(services.run_create(automation=automation, inputs={}).run.pk)

    assert run.status == RunStatus.FAILED
    after = scrape(client)
    assert value(after, "autoplane_runs_finished_total", status="failed") == (
        value(before, "autoplane_runs_finished_total", status="failed") + 1
    )
    assert value(after, "autoplane_steps_total", action="http_request", outcome="failed") == (
        value(before, "autoplane_steps_total", action="http_request", outcome="failed") + 1
    )


def test_webhook_rejections_and_http_requests_are_counted(client, workspace):
    automation = _automation(workspace, transform("a", 1))
    before = scrape(client)

    response = client.post(
        f"/api/v1/automations/{automation.pk}/fire", data="{}", content_type="application/json",
        HTTP_AUTHORIZATION="Bearer not-a-token",
    )  # fmt: skip

    assert response.status_code == 401
    after = scrape(client)
    assert value(after, "autoplane_webhook_rejections_total", code="UNAUTHENTICATED") == (
        value(before, "autoplane_webhook_rejections_total", code="UNAUTHENTICATED") + 1
    )

    def fires(sample) -> dict:  # {(route, status): count} of the fire endpoint (other tests' included)
        return {(dict(labels)["route"], dict(labels)["status"]): count for (name, labels), count in sample.items()
                if name == "autoplane_http_requests_total" and dict(labels)["route"].endswith("/fire")}  # fmt: skip

    grown = {
        key: n - fires(before).get(key, 0)
        for key, n in fires(after).items()
        if n != fires(before).get(key, 0)
    }
    assert list(grown.values()) == [1]
    ((route, status),) = grown
    assert status == "4xx"
    assert "<" in route  # the pattern, not the automation's id
    # The scrape itself was counted by route, never by path
    assert value(after, "autoplane_http_requests_total", method="GET", route="metrics", status="2xx") >= 1


def test_process_and_python_metrics_are_exported(client, db):
    scraped = scrape(client)

    assert any(name == "process_resident_memory_bytes" for name, _ in scraped)
    assert any(name == "python_info" for name, _ in scraped)


def test_the_runs_gauge_counts_only_runs_not_yet_final(client, db):
    statuses = {dict(labels)["status"] for name, labels in scrape(client) if name == "autoplane_runs"}

    assert {"queued", "running"} <= statuses
    assert not statuses & {"succeeded", "failed", "cancelled", "timed_out"}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian: prometheus)")
def test_promtool_accepts_the_scrape(client, db):
    text = client.get("/metrics").content

    checked = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, timeout=60)

    # promtool exits 1 for lint advice too; only real problems (parse errors) are failures here
    problems = [line for line in checked.stderr.decode().splitlines() if "error" in line.lower()]
    assert not problems, checked.stderr.decode()


def _wait_for_status(run_id, statuses, timeout=60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = Run.objects.filter(pk=run_id).values_list("status", flat=True).first()
        if status in statuses:
            return status
        time.sleep(0.05)
    raise AssertionError(f"run {run_id} still {status} after {timeout} s")


def test_counters_add_up_across_worker_processes_and_outlive_them(worker_factory, tmp_path):
    """Two worker processes, one after the other, count into PROMETHEUS_MULTIPROC_DIR; /metrics'
    registry sums both, and the first one's count stays after it exited."""
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    env = live_worker_env(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir))
    workspace = workspace_get_or_create(slug="acme")
    automation = _automation(workspace, transform("a", {"x": 1}))

    def succeeded() -> float:
        text = generate_latest(build_registry(str(metrics_dir))).decode()
        return value(samples(text), "autoplane_runs_finished_total", status="succeeded")

    finished = []
    for _ in range(2):
        worker = worker_factory(queues=["automations_fast"], env=env)
        run = services.run_create(automation=automation, inputs={}).run
        assert _wait_for_status(run.pk, {RunStatus.SUCCEEDED, RunStatus.FAILED}) == RunStatus.SUCCEEDED
        deadline = time.monotonic() + 10  # counted right after the commit that the test just saw
        while succeeded() < len(finished) / 2 + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        finished.append(succeeded())
        worker.stop(timeout=60)
        finished.append(succeeded())

    assert finished == [1, 1, 2, 2]


def test_up_gives_its_children_one_metrics_directory_emptied_at_start(settings, tmp_path):
    settings.DATA_DIR = tmp_path
    stale = metrics_dir_for(8123)
    stale.mkdir()
    (stale / "counter_oldhost-1.db").write_bytes(b"old")

    fresh = fresh_metrics_dir(8123)
    specs = build_specs(host="127.0.0.1", port=8123, concurrency=dict.fromkeys(QUEUES, 1), web_workers=2)

    assert list(fresh.iterdir()) == []
    assert {spec.env["PROMETHEUS_MULTIPROC_DIR"] for spec in specs} == {str(fresh)}


def test_the_grafana_dashboard_queries_only_series_the_platform_exports():
    dashboard = json.loads((REPO / "ops" / "grafana" / "autoplane.json").read_text())
    exported = (REPO / "config" / "instruments.py").read_text() + (REPO / "ops" / "metrics.py").read_text()

    queried = {name for panel in dashboard["panels"] for target in panel["targets"]
               for name in re.findall(r"autoplane_[a-z_]+", target["expr"])}  # fmt: skip
    assert queried
    for name in queried:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert f'"{base}"' in exported, name
