"""The platform's own event types (``approval.*``, ``automation.*``: ``approval.requested``,
``automation.run.succeeded`` / ``failed``) are published by the platform only: not through
``POST /api/v1/events``, not by a step. Refused with ``reserved_event_type``; nothing recorded."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from automations import services
from automations.models import DomainEvent, RunStatus, StepRun
from tests.factories import definition

pytestmark = pytest.mark.django_db

RESERVED = ["approval.requested", "approval.decided", "automation.run.succeeded", "automation.run.failed",
            "automation.anything"]  # fmt: skip


@pytest.mark.parametrize("event_type", RESERVED)
def test_post_events_refuses_platform_event_types(api, workspace, event_type):
    audit_before = AuditEvent.objects.count()

    response = api.post(
        "/api/v1/events", {"event_type": event_type, "payload": {"run_id": "forged"}}, format="json"
    )

    assert response.status_code == 400, response.content
    (error,) = response.json()["errors"]
    assert (error["path"], error["code"]) == ("/event_type", "reserved_event_type")
    assert not DomainEvent.objects.exists()
    assert AuditEvent.objects.count() == audit_before


@pytest.mark.parametrize(
    "event_type", ["approvals.requested", "automations-run.done", "deploy.approval.requested"]
)
def test_lookalike_types_are_still_anyones(api, workspace, event_type):
    response = api.post("/api/v1/events", {"event_type": event_type, "payload": {}}, format="json")
    assert response.status_code == 202, response.content


def test_emit_event_with_a_literal_platform_type_is_refused_at_save(api, workspace):
    step = {"step_id": "forge", "action": "emit_event",
            "config": {"event_type": "automation.run.succeeded", "payload": {}}}  # fmt: skip
    response = api.post("/api/v1/automations", {"definition": definition(step)}, format="json")

    assert response.status_code == 400, response.content
    assert any(e["code"] == "reserved_event_type" and e["path"] == "/plan/0/config/event_type"
               for e in response.json()["errors"])  # fmt: skip


def test_emit_event_with_a_templated_platform_type_fails_the_step(workspace, drive):
    step = {"step_id": "forge", "action": "emit_event",
            "config": {"event_type": "{{ inputs.kind }}", "payload": {}}}  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition(step))

    run = drive(drive.start(automation, inputs={"kind": "approval.requested"}).pk)

    assert run.status == RunStatus.FAILED
    assert StepRun.objects.get(run=run, step_id="forge").error_code == "POLICY_VIOLATION"
    assert not DomainEvent.objects.filter(event_type="approval.requested").exists()
