"""Deleting an automation archives it (issue 16): it leaves lists, its triggers stop and it cannot
run, while its runs, steps and versions stay readable; purging is a separate, audited admin action."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import PeriodicTask

from audit.models import AuditEvent
from audit.sequencer import sequence_pending
from audit.verify import verify_all
from automations import events, services
from automations.models import Automation, AutomationVersion, Run, RunStatus, StepRun
from triggers.models import Trigger
from triggers.services import trigger_token_rotate

pytestmark = pytest.mark.django_db

DEFINITION = {
    "schema_version": "1.0",
    "name": "to archive",
    "triggers": [
        {"key": "hook", "type": "webhook", "config": {}},
        {"key": "cron", "type": "schedule", "config": {"cron": "0 * * * *"}},
        {"key": "on", "type": "event", "config": {"event_type": "thing.happened"}},
    ],
    "plan": [{"step_id": "echo", "action": "transform_data", "config": {"output": {"ok": True}}}],
}


@pytest.fixture
def archived_setup(api, workspace, owner, drive):
    created = api.post("/api/v1/automations", DEFINITION, format="json").json()
    automation = Automation.objects.get(pk=created["id"])
    api.patch(
        f"/api/v1/automations/{automation.pk}", {"definition": {**DEFINITION, "name": "v2"}}, format="json"
    )
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation, key="hook"), user=owner)
    run_id = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json").json()["run_id"]
    assert drive(run_id).status == RunStatus.SUCCEEDED

    response = api.delete(f"/api/v1/automations/{automation.pk}")

    assert response.status_code == 204
    return automation, run_id, token


def test_archive_keeps_runs_steps_and_versions_readable(api, archived_setup):
    automation, run_id, _token = archived_setup

    assert Run.objects.filter(pk=run_id).exists()
    run = api.get(f"/api/v1/runs/{run_id}")
    assert run.status_code == 200
    assert [step["step_id"] for step in run.json()["steps"]] == ["echo"]
    by_automation = api.get(f"/api/v1/runs?automation={automation.pk}").json()["results"]
    assert [r["id"] for r in by_automation] == [run_id]
    versions = api.get(f"/api/v1/automations/{automation.pk}/versions").json()["results"]
    assert [v["version"] for v in versions] == [2, 1]
    detail = api.get(f"/api/v1/automations/{automation.pk}").json()
    assert detail["archived_at"] is not None
    assert AuditEvent.objects.filter(type="automation.archived", refs__automation=str(automation.pk)).exists()
    assert api.delete(f"/api/v1/automations/{automation.pk}").status_code == 204, "archiving again is a no-op"


def test_an_archived_automation_leaves_lists_unless_asked_for(api, archived_setup):
    automation, _run_id, _token = archived_setup
    live = api.post(
        "/api/v1/automations", {**DEFINITION, "name": "live", "triggers": []}, format="json"
    ).json()

    listed = [a["id"] for a in api.get("/api/v1/automations").json()["results"]]
    archived = [a["id"] for a in api.get("/api/v1/automations?archived=true").json()["results"]]

    assert listed == [live["id"]]
    assert archived == [str(automation.pk)]
    assert api.get("/api/v1/automations?archived=maybe").status_code == 400


def test_an_archived_automation_cannot_fire_run_or_change(api, archived_setup, client):
    automation, run_id, token = archived_setup
    runs_before = Run.objects.count()

    fire = client.post(f"/api/v1/automations/{automation.pk}/fire", b"{}", content_type="application/json",
                       HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
    run_now = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    rerun = api.post(f"/api/v1/runs/{run_id}/rerun", {}, format="json")
    edit = api.patch(f"/api/v1/automations/{automation.pk}", {"status": "active"}, format="json")

    assert fire.status_code == 410
    assert fire.json()["error"]["code"] == "GONE"
    assert (run_now.status_code, run_now.json()["error"]["message"]) == (409, "the automation is archived")
    assert rerun.status_code == 409
    assert edit.status_code == 409
    assert Run.objects.count() == runs_before
    assert not Trigger.objects.filter(automation=automation, enabled=True).exists()
    task = Trigger.objects.get(automation=automation, key="cron").periodic_task
    assert task is not None
    assert task.enabled is False
    assert not Trigger.objects.filter(event_type="thing.happened", enabled=True).exists()


def test_an_archived_automation_matches_no_event(api, archived_setup, drive):
    before = Run.objects.count()

    response = api.post("/api/v1/events", {"event_type": "thing.happened", "payload": {}}, format="json")
    assert response.status_code == 202
    events.deliver(response.json()["event_id"])  # what the delivery task does

    assert Run.objects.count() == before


def test_archiving_is_refused_while_runs_are_active(api, workspace, owner):
    created = api.post("/api/v1/automations", {**DEFINITION, "triggers": []}, format="json").json()
    api.post(f"/api/v1/automations/{created['id']}/run", {}, format="json")  # queued, not driven

    response = api.delete(f"/api/v1/automations/{created['id']}")

    assert response.status_code == 409
    assert Automation.objects.get(pk=created["id"]).archived_at is None


def test_purge_is_separate_refused_unless_archived_and_keeps_the_ledger_verifiable(
    api, archived_setup, owner
):
    automation, run_id, _token = archived_setup
    live = services.automation_create(workspace=automation.workspace, user=owner,
                                      definition={**DEFINITION, "name": "live", "triggers": []})  # fmt: skip
    with pytest.raises(CommandError, match="archive the automation before purging it"):
        call_command("purge_automation", str(live.pk))
    tasks = list(Trigger.objects.filter(automation=automation).values_list("periodic_task_id", flat=True))
    ledger_before = AuditEvent.objects.count()

    out = io.StringIO()
    call_command("purge_automation", str(automation.pk), stdout=out)

    assert "purged v2: 1 run(s), 1 step(s), 2 version(s)" in out.getvalue()
    assert not Automation.objects.filter(pk=automation.pk).exists()
    assert not Run.objects.filter(pk=run_id).exists()
    assert not StepRun.objects.filter(run_id=run_id).exists()
    assert not AutomationVersion.objects.filter(automation_id=automation.pk).exists()
    assert not PeriodicTask.objects.filter(pk__in=[t for t in tasks if t]).exists()
    assert api.get(f"/api/v1/runs/{run_id}").status_code == 404
    purged = AuditEvent.objects.get(type="automation.purged")
    assert purged.payload["runs"] == 1
    assert purged.actor == "command:purge_automation"
    assert AuditEvent.objects.count() == ledger_before + 1, "the ledger only grows"
    sequence_pending()
    assert verify_all().ok
