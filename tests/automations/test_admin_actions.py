"""The admin's bulk actions (Run now, Pause, Resume on automations; Cancel, Re-run, Resolve on runs):
each checks the user's role per object and leaves an audit row only when it acted."""

from __future__ import annotations

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations import services
from automations.models import Automation, Run, RunStatus
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(content_type__app_label="automations"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def automation(workspace, operator):
    return services.automation_create(workspace=workspace, user=operator,
                                      definition=definition(transform("a", 1), name="bulk"))  # fmt: skip


def _act(client, changelist: str, action: str, *ids) -> str:
    response = client.post(reverse(changelist), {"action": action, ACTION_CHECKBOX_NAME: [str(i) for i in ids]},
                           follow=True)  # fmt: skip
    assert response.status_code == 200
    return response.content.decode()


AUTOMATIONS = "admin:automations_automation_changelist"
RUNS = "admin:automations_run_changelist"


@pytest.mark.parametrize(("action", "audited"), [("pause", "automation.paused"), ("run_now", "run.created")])
def test_automation_actions_refuse_a_viewer_and_work_for_an_operator(
    automation, operator, viewer, action, audited
):
    before = AuditEvent.objects.filter(type=audited).count()

    refused = _act(staff(viewer), AUTOMATIONS, action, automation.pk)
    assert "does not allow" in refused
    assert AuditEvent.objects.filter(type=audited).count() == before
    automation.refresh_from_db()
    assert automation.status == "active"
    assert not Run.objects.exists()

    _act(staff(operator), AUTOMATIONS, action, automation.pk)
    assert AuditEvent.objects.filter(type=audited).count() == before + 1


def test_resume_is_audited(automation, operator):
    Automation.objects.filter(pk=automation.pk).update(status="paused")

    _act(staff(operator), AUTOMATIONS, "resume", automation.pk)

    automation.refresh_from_db()
    assert automation.status == "active"
    assert AuditEvent.objects.filter(type="automation.resumed", actor="user:operator").count() == 1


@pytest.mark.parametrize(("action", "status", "audited"), [
    ("cancel", RunStatus.QUEUED, "operator.run.cancelled"),
    ("rerun", RunStatus.FAILED, "operator.run.rerun"),
    ("resolve_failed", RunStatus.NEEDS_ATTENTION, "operator.run.resolved"),
    ("resolve_retry", RunStatus.NEEDS_ATTENTION, "operator.run.resolved"),
])  # fmt: skip
def test_run_actions_refuse_a_viewer_and_work_for_an_operator(
    automation, operator, viewer, action, status, audited
):
    run = services.run_create(automation=automation, inputs={}, user=operator).run
    Run.objects.filter(pk=run.pk).update(status=status)

    refused = _act(staff(viewer), RUNS, action, run.pk)
    assert "does not allow" in refused
    assert AuditEvent.objects.filter(type=audited).count() == 0
    assert Run.objects.get(pk=run.pk).status == status

    _act(staff(operator), RUNS, action, run.pk)
    assert AuditEvent.objects.filter(type=audited, actor="user:operator").count() >= 1
