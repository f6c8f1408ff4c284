"""``manage.py up`` on RabbitMQ: a run with a ``wait`` step, the event chain it starts, a ping on every
queue through the ``rpc://`` result backend, and queues declared with their consumer timeout.

Skipped when no RabbitMQ answers at ``AUTOPLANE_TEST_AMQP_URL`` (default the local one,
``amqp://guest:guest@127.0.0.1:5672//``); point it at a vhost of your own to keep other users'
messages apart.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

from config.celery import QUEUES
from tests.live import REPO
from tests.ops.test_up import _free_port, _healthz, up_env  # noqa: F401 - up_env is a fixture

AMQP_URL = os.environ.get("AUTOPLANE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
TIMEOUT = {"x-consumer-timeout": 7200 * 1000}  # CELERY_VISIBILITY_TIMEOUT's default, in ms


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5672), timeout=1):
            return True
    except OSError:
        return False


pytestmark = [
    pytest.mark.workers,
    pytest.mark.skipif(not _reachable(AMQP_URL), reason=f"no RabbitMQ at {urlparse(AMQP_URL).netloc}"),
]


def _api(port: int, token: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_up_on_rabbitmq_runs_a_wait_an_event_chain_and_pings_every_queue(up_env, tmp_path, monkeypatch):  # noqa: F811
    env = {**up_env["env"], "CELERY_BROKER_URL": AMQP_URL}
    env.pop("CELERY_RESULT_BACKEND", None)  # the default for amqp: rpc://
    port = _free_port()
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            [REPO / "autoplane", "up", "--port", str(port), "--concurrency", "1", "--web-workers", "1",
             "--stop-timeout", "60"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        _until(lambda: up.poll() is not None or _healthz(port)[0] == 200, 180, "up to be healthy")
        log_text = log_path.read_text(errors="replace")
        assert _healthz(port)[0] == 200, log_text[-4000:]
        token = re.search(r"API token  (\S+)", log_text).group(1)

        # Given: A waits a second then succeeds; B runs on A's automation.run.succeeded event
        status, first = _api(port, token, "POST", "automations", {
            "schema_version": "1.0", "name": "rabbit first",
            "plan": [{"step_id": "pause", "action": "wait", "config": {"seconds": 1}},
                     {"step_id": "done", "action": "transform_data", "config": {"output": {"ok": True}}}],
        })  # fmt: skip
        assert status == 201, first
        status, second = _api(port, token, "POST", "automations", {
            "schema_version": "1.0", "name": "rabbit second",
            "triggers": [{"key": "after", "type": "event", "config": {
                "event_type": "automation.run.succeeded",
                "filter": {"path": "payload.automation_id", "equals": first["id"]}}}],
            "plan": [{"step_id": "echo", "action": "transform_data", "config": {"output": "{{ event.payload.status }}"}}],
        })  # fmt: skip
        assert status == 201, second

        # When: A is run
        status, fired = _api(port, token, "POST", f"automations/{first['id']}/run", {})
        assert status == 202, fired

        # Then: A waits, then succeeds; B is started by the event and succeeds
        def run_of(automation_id, wanted):
            _, page = _api(port, token, "GET", f"runs?automation={automation_id}")
            runs = page.get("results", [])
            return runs[0] if runs and runs[0]["status"] in wanted else None

        finished = _until(lambda: run_of(first["id"], {"succeeded", "failed"}), 60, "the first run")
        assert finished["status"] == "succeeded", finished
        chained = _until(lambda: run_of(second["id"], {"succeeded", "failed"}), 60, "the chained run")
        assert chained["status"] == "succeeded", chained
        assert finished["id"] == fired["run_id"]
        _, detail = _api(port, token, "GET", f"runs/{finished['id']}")
        assert [s["status"] for s in detail["steps"]] == ["succeeded", "succeeded"]

        # And: a ping on each queue comes back through the rpc:// result backend (Celery prefers
        # these variables to its arguments)
        monkeypatch.setenv("CELERY_BROKER_URL", AMQP_URL)
        monkeypatch.setenv("CELERY_RESULT_BACKEND", "rpc://")
        app = Celery("rabbittest", broker=AMQP_URL, backend="rpc://", set_as_current=False)
        app.conf.task_queues = [Queue(q, Exchange(q), routing_key=q, queue_arguments=TIMEOUT) for q in QUEUES]
        try:
            for queue in QUEUES:
                assert (
                    app.send_task("autoplane.ping", args=[queue], queue=queue).get(timeout=60)["value"]
                    == queue
                )
        finally:
            app.close()

        # And: each queue carries its consumer timeout (RabbitMQ >= 3.12 applies it)
        with Connection(AMQP_URL) as connection:
            for queue in QUEUES:
                connection.default_channel.queue_declare(
                    queue=queue, durable=True, auto_delete=False, arguments=TIMEOUT
                )  # the same arguments again: accepted (another value would be PRECONDITION_FAILED)

        os.killpg(up.pid, signal.SIGINT)
        assert up.wait(timeout=90) == 0, log_path.read_text(errors="replace")[-4000:]
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)
