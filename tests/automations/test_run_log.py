"""One INFO log line per run state change (issue 16: quiet, useful logs)."""

from __future__ import annotations

import logging

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from automations import services
from automations.models import RunStatus

pytestmark = pytest.mark.django_db

GATED = {
    "schema_version": "1.0",
    "name": "logged",
    "execution": {"autonomy": "A2"},
    "plan": [
        {"step_id": "shape", "action": "transform_data", "config": {"output": {"ok": True}}},
        {"step_id": "ask", "action": "require_approval", "config": {"message": "go?"}},
    ],
}


@pytest.fixture
def quiet_broker(monkeypatch):
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


def _lines(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "autoplane.runs" and r.levelno == logging.INFO
    ]


def test_each_state_change_of_a_run_is_one_info_line(
    workspace, owner, drive, caplog, quiet_broker, django_capture_on_commit_callbacks
):
    caplog.set_level(logging.INFO, logger="autoplane.runs")
    automation = services.automation_create(workspace=workspace, definition=GATED, user=owner)

    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_create(automation=automation, inputs={}, user=owner).run
        assert drive(run.pk).status == RunStatus.AWAITING_APPROVAL
        approval_decide(approval_id=Approval.objects.get(run_id=run.pk).pk, user=owner, decision="approve")
        services.run_resume(run_id=str(run.pk))
        assert drive(run.pk).status == RunStatus.SUCCEEDED

    changes = [line.split(":")[0].removeprefix(f"run {run.pk} ") for line in _lines(caplog)]
    assert changes == ["queued", "running", "running -> awaiting_approval", "awaiting_approval -> queued",
                       "running", "running -> succeeded"]  # fmt: skip
    assert all(line.startswith(f"run {run.pk} ") for line in _lines(caplog))
