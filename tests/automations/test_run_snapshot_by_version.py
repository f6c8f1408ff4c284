"""A dispatched run keeps no copy of its definition: it refers to its automation version's stored
one (Run.snapshot), read once per process. Its API output and execution are those of the
definition it was created with, after later versions too; a re-run executes the same one."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from automations import executor, models, services
from automations.models import AutomationVersion, Run, RunStatus
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db


def create(workspace, *steps):
    return services.automation_create(workspace=workspace, definition=definition(*steps))


def start(automation):
    return services.run_create(automation=automation, inputs={}).run


def stored_copy(run) -> object:
    return Run.objects.filter(pk=run.pk).values_list("snapshot_copy", flat=True).get()


def test_a_dispatched_run_stores_no_copy_and_reads_its_versions_definition(workspace):
    automation = create(workspace, transform("a", "one", output_as="a"))
    run = start(automation)
    assert stored_copy(run) is None
    models._VERSION_DEFINITIONS.clear()  # a worker that has not seen this version yet
    fresh = Run.objects.get(pk=run.pk)
    with CaptureQueriesContext(connection) as first:
        assert fresh.snapshot == automation.definition
    assert len(first.captured_queries) == 1  # the version, once per process
    again = Run.objects.get(pk=run.pk)
    with CaptureQueriesContext(connection) as second:
        assert again.snapshot == automation.definition
        again.snapshot["plan"].append({"mutated": True})  # a run's dict is its own
    assert second.captured_queries == []
    assert Run.objects.get(pk=run.pk).snapshot == automation.definition


def test_runs_of_an_old_version_execute_it_after_a_new_version_is_saved(workspace, drive, api):
    automation = create(workspace, transform("a", "one", output_as="a"))
    old = start(automation)
    services.automation_update(
        automation=automation, definition=definition(transform("b", "two", output_as="b"))
    )
    new = start(automation)
    assert (old.automation_version, new.automation_version) == (1, 2)
    assert stored_copy(old) is None
    assert stored_copy(new) is None
    models._VERSION_DEFINITIONS.clear()
    assert [s["step_id"] for s in api.get(f"/api/v1/runs/{old.pk}").json()["steps"]] == ["a"]
    assert [s["step_id"] for s in api.get(f"/api/v1/runs/{new.pk}").json()["steps"]] == ["b"]
    old, new = drive(old.pk), drive(new.pk)
    assert (old.status, old.output, new.status, new.output) == (
        RunStatus.SUCCEEDED,
        "one",
        RunStatus.SUCCEEDED,
        "two",
    )

    response = api.post(f"/api/v1/runs/{old.pk}/rerun", {}, format="json")  # the same definition again
    assert response.status_code == 202, response.content
    rerun = Run.objects.get(pk=response.json()["run_id"])
    assert (rerun.automation_version, stored_copy(rerun)) == (1, None)
    rerun = drive(rerun.pk)
    assert (rerun.status, rerun.output) == (RunStatus.SUCCEEDED, "one")


def test_a_run_given_its_definition_keeps_its_copy_and_a_rerun_of_it_too(workspace, drive, api):
    automation = create(workspace, transform("a", "one", output_as="a"))
    own = definition(transform("mine", "own", output_as="mine"))
    run = Run.objects.create(workspace=workspace, automation=automation, automation_version=1, snapshot=own,
                             queue="automations_default", enqueued_at=timezone.now(), trace_id=uuid.uuid4().hex)  # fmt: skip
    assert stored_copy(run) == own
    assert drive(run.pk).output == "own"
    response = api.post(f"/api/v1/runs/{run.pk}/rerun", {}, format="json")
    assert response.status_code == 202, response.content
    assert stored_copy(Run.objects.get(pk=response.json()["run_id"])) == own


def test_versions_are_not_rewritten(workspace):
    """The cache relies on this: saving a changed definition adds a version, never edits one."""
    automation = create(workspace, transform("a", "one"))
    first = AutomationVersion.objects.get(automation=automation, version=1).definition
    services.automation_update(automation=automation, definition=definition(transform("a", "two")))
    restored = services.automation_version_restore(automation=automation, version=1)
    assert restored.version == 3
    assert AutomationVersion.objects.get(automation=automation, version=1).definition == first
    assert AutomationVersion.objects.get(automation=automation, version=3).definition == first


def test_the_admin_shows_an_old_version_runs_steps_after_a_new_version(workspace, drive, admin_client):
    automation = create(workspace, transform("a", "one", output_as="a"), transform("b", "{{ a }}-b"))
    old = drive(start(automation).pk)
    services.automation_update(automation=automation, definition=definition(transform("c", "two")))
    models._VERSION_DEFINITIONS.clear()
    form = admin_client.get(reverse("admin:automations_run_rerun", args=[old.pk])).content.decode()
    assert '<option value="b">b</option>' in form
    assert '<option value="c">' not in form
    page = admin_client.get(reverse("admin:automations_run_change", args=[old.pk]))
    assert page.status_code == 200


def test_a_run_taken_over_from_a_dead_worker_goes_on_with_its_version(workspace):
    """A new worker process (empty cache) takes over a run whose lease ran out after a new
    version was saved: it executes the version the run was created with."""
    automation = create(workspace, transform("a", "one", output_as="a"), transform("b", "{{ a }}-b"))
    run = start(automation)
    assert executor.claim(str(run.pk), "worker-1:1") is not None  # then worker 1 dies
    services.automation_update(automation=automation, definition=definition(transform("c", "two")))
    Run.objects.filter(pk=run.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    models._VERSION_DEFINITIONS.clear()
    assert executor.execute_run(str(run.pk), "worker-2:2") == RunStatus.SUCCEEDED
    done = Run.objects.get(pk=run.pk)
    assert (done.output, done.recoveries, stored_copy(done)) == ("one-b", 1, None)
