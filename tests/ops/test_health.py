from __future__ import annotations

import io
import re
import shutil
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from config.celery import QUEUES
from ops.models import Heartbeat, HeartbeatKind
from ops.supervisor import ChildSpec, Supervisor
from ops.tasks import TICK_NAME, beat_heartbeat


def _beat(name: str, kind: str, *, queues=(), age: float = 0.0) -> Heartbeat:
    seen = timezone.now() - timedelta(seconds=age)
    return Heartbeat.objects.create(
        name=name, kind=kind, queues=list(queues), pid=1, started_at=seen, seen_at=seen
    )


@pytest.fixture
def no_heartbeats(db):
    # Inside the test's transaction, so a shared worker's row is back afterwards.
    Heartbeat.objects.all().delete()


def test_healthz_without_workers_or_beat_is_503_naming_them(client, no_heartbeats):
    response = client.get("/healthz")

    assert response.status_code == 503
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body["status"] == "degraded"
    assert set(body["failing"]) == {"beat", *(f"queues.{q}" for q in QUEUES)}
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["broker"]["ok"] is True
    assert body["checks"]["queues"]["automations_fast"] == {"ok": False, "workers": 0}


def test_healthz_with_fresh_heartbeats_is_200(client, no_heartbeats):
    _beat("w1@host", HeartbeatKind.WORKER, queues=QUEUES)
    _beat("w2@host", HeartbeatKind.WORKER, queues=["automations_fast"])
    _beat("beat@host", HeartbeatKind.BEAT)

    response = client.get("/healthz")

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body == {**body, "status": "ok", "failing": []}
    assert body["checks"]["queues"]["automations_fast"] == {"ok": True, "workers": 2}
    assert body["checks"]["beat"]["instances"] == 1


def test_healthz_reports_the_sandbox_backend(client, no_heartbeats, settings):
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"
    settings.AUTOPLANE_BWRAP_PATH = "/nonexistent/bwrap"  # a host without bubblewrap
    _beat("w1@host", HeartbeatKind.WORKER, queues=QUEUES)
    _beat("beat@host", HeartbeatKind.BEAT)

    body = client.get("/healthz").json()

    assert body["checks"]["sandbox"] == {
        "backend": "bubblewrap", "ok": False, "isolated": True, "error": "unavailable: code steps fail closed",
    }  # fmt: skip
    assert "sandbox" not in body["failing"], "reported, not a platform failure: code steps fail closed"

    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = True
    assert client.get("/healthz").json()["checks"]["sandbox"] == {
        "backend": "subprocess", "ok": True, "isolated": False,
    }  # fmt: skip


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_healthz_reports_a_working_bubblewrap(client, no_heartbeats):
    assert client.get("/healthz").json()["checks"]["sandbox"] == {
        "backend": "bubblewrap", "ok": True, "isolated": True,
    }  # fmt: skip


def test_stale_heartbeats_count_as_absent(client, no_heartbeats):
    _beat("w1@host", HeartbeatKind.WORKER, queues=QUEUES, age=60)
    _beat("w2@host", HeartbeatKind.WORKER, queues=["default"], age=1)
    _beat("beat@host", HeartbeatKind.BEAT, age=60)

    body = client.get("/healthz").json()

    assert set(body["failing"]) == {"beat", "queues.automations_fast", "queues.automations_medium",
                                    "queues.automations_long"}  # fmt: skip
    assert body["checks"]["beat"]["heartbeat_age_seconds"] >= 59


def test_two_beats_are_degraded(client, no_heartbeats):
    _beat("w1@host", HeartbeatKind.WORKER, queues=QUEUES)
    _beat("beat@host-a", HeartbeatKind.BEAT)
    _beat("beat@host-b", HeartbeatKind.BEAT)

    response = client.get("/healthz")

    assert response.status_code == 503
    assert response.json()["failing"] == ["beat"]
    assert "exactly one" in response.json()["checks"]["beat"]["error"]


def test_healthz_and_unknown_api_paths_answer_json_never_html(client, no_heartbeats):
    for method, path, status in [("get", "/healthz", 503), ("post", "/healthz", 405), ("get", "/api/v1/unknown", 404),
                                 ("get", "/healthz/nope", 404)]:  # fmt: skip
        response = getattr(client, method)(path)

        assert response.status_code == status, path
        assert response["Content-Type"].startswith("application/json"), path
        assert "<html" not in response.content.decode().lower()


def test_beat_heartbeat_task_records_the_tick(client, no_heartbeats):
    beat_heartbeat()

    tick = Heartbeat.objects.get(name=TICK_NAME)
    assert tick.kind == HeartbeatKind.TICK
    assert client.get("/healthz").json()["checks"]["beat"]["last_tick_age_seconds"] < 5


def test_metrics_speak_prometheus_text(client, no_heartbeats):
    _beat("w1@host", HeartbeatKind.WORKER, queues=["automations_fast"])

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert 'autoplane_workers{queue="automations_fast"} 1.0' in text
    assert 'autoplane_workers{queue="automations_long"} 0.0' in text
    assert "autoplane_beat_instances 0.0" in text
    assert "autoplane_audit_chain_length" in text
    assert 'autoplane_queue_backlog{queue="default"}' in text
    assert 'autoplane_runs{status="queued"} 0.0' in text
    for section in ("processes", "broker", "runs", "approvals", "audit"):
        assert f'autoplane_scrape_errors{{section="{section}"}} 0.0' in text


def test_a_crash_looping_child_of_up_is_named_by_healthz_and_its_restarts_counted(
    client, no_heartbeats, settings, tmp_path
):
    _beat("w1@host", HeartbeatKind.WORKER, queues=QUEUES)
    _beat("beat@host", HeartbeatKind.BEAT)
    settings.AUTOPLANE_SUPERVISOR_STATE_FILE = str(tmp_path / "up.state.json")
    sleeper = ChildSpec("web", [sys.executable, "-c", "import time; time.sleep(60)"])
    crasher = ChildSpec("worker-fast", [sys.executable, "-c", "raise SystemExit(3)"])
    supervisor = Supervisor([sleeper, crasher], out=io.StringIO(), stop_timeout=1.0, backoff_start=0.05,
                            startup_grace=0.0, state_file=settings.AUTOPLANE_SUPERVISOR_STATE_FILE)  # fmt: skip
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while supervisor.children[1].restarts < 4 and time.monotonic() < deadline:
            time.sleep(0.05)

        response = client.get("/healthz")
        metrics = client.get("/metrics").content.decode()
    finally:
        supervisor.stop()
        thread.join(15)

    body = response.json()
    assert response.status_code == 503
    assert body["failing"] == ["processes.worker-fast"]
    assert body["checks"]["processes"]["web"]["ok"] is True
    assert body["checks"]["processes"]["worker-fast"]["restarts"] >= 4
    assert 'autoplane_process_restarts_total{process="web"} 0.0' in metrics
    restarts = re.search(r'autoplane_process_restarts_total\{process="worker-fast"\} (\d+)', metrics)
    assert restarts
    assert int(restarts.group(1)) >= 4
