"""LOG_FORMAT=json: one JSON object per line, with run_id, trace_id, workspace and step_id where they apply."""

from __future__ import annotations

import io
import json
import logging
import re
import time

import pytest

from automations import services
from automations.models import Run, RunStatus
from config.logs import JsonFormatter, bound, json_line
from tests.factories import definition, transform
from tests.live import live_worker_env
from workspaces.services import workspace_get_or_create

PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


@pytest.fixture
def json_log():
    """The root logger also writes JSON lines into a buffer (what LOG_FORMAT=json configures)."""
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level, root.level = root.level, logging.INFO
    yield buffer
    root.removeHandler(handler)
    root.level = level


def test_a_line_is_one_json_object_with_bound_fields_extras_and_the_traceback(json_log):
    with bound(run_id="r1", trace_id="t1", workspace=3):
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("automations.test").exception("step %s failed", "s1", extra={"step_id": "s1"})
    logging.getLogger("automations.test").warning("after\nthe run")

    first, second = [json.loads(line) for line in json_log.getvalue().splitlines()]
    assert first["message"] == "step s1 failed"
    assert (first["run_id"], first["trace_id"], first["workspace"], first["step_id"]) == ("r1", "t1", 3, "s1")
    assert first["level"] == "ERROR"
    assert first["logger"] == "automations.test"
    assert "ValueError: boom" in first["exc"]
    assert first["ts"].endswith("Z")
    assert second["message"] == "after\nthe run"  # a newline stays inside the one line
    assert "run_id" not in second


def test_up_wraps_a_childs_plain_line_and_tags_a_json_one():
    wrapped = json.loads(json_line("web", "[INFO] Booting worker with pid: 7\n"))
    tagged = json.loads(json_line("worker-fast", '{"level": "INFO", "message": "hi", "run_id": "r"}'))

    assert (wrapped["process"], wrapped["message"]) == ("web", "[INFO] Booting worker with pid: 7")
    assert tagged == {"level": "INFO", "message": "hi", "run_id": "r", "process": "worker-fast"}


def test_a_worker_with_log_format_json_logs_the_run_it_executes_with_its_run_id(worker_factory):
    worker = worker_factory(queues=["automations_fast"], env=live_worker_env(LOG_FORMAT="json"))
    workspace = workspace_get_or_create(slug="acme")
    automation = services.automation_create(workspace=workspace, definition=definition(transform("a", 1)))

    run = services.run_create(automation=automation, inputs={}).run
    deadline = time.monotonic() + 60
    while (
        not Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists() and time.monotonic() < deadline
    ):
        time.sleep(0.05)
    worker.stop(timeout=60)

    log = worker.log_path.read_text(errors="replace").splitlines()
    assert not [line for line in log if PLAIN_LINE.match(line)], "a log line in the text format"
    entries = [json.loads(line) for line in log if line.startswith("{")]
    mine = [e for e in entries if e.get("run_id") == str(run.pk)]
    assert mine, entries[-10:]
    assert {e["trace_id"] for e in mine} == {run.trace_id}
    assert {e["workspace"] for e in mine} == {workspace.pk}
