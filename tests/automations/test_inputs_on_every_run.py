"""``$last_fired_at`` is defined on every run (SPEC §3's "since" example), and an input that
is genuinely missing fails the step with an error that names it."""

from __future__ import annotations

import pytest

from automations import services
from automations.models import Run, RunStatus, StepRun
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

SINCE = {"schema": {"type": "object",
                    "properties": {"since": {"type": "string", "format": "date-time", "default": "$last_fired_at"}}}}  # fmt: skip


def run_now(api, automation) -> Run:
    response = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    assert response.status_code == 202, response.json()
    return Run.objects.get(pk=response.json()["run_id"])


def test_run_now_has_last_fired_at_first_the_automations_creation_then_the_previous_run(
    workspace, api, drive
):
    # Given: SPEC §3's input, used in a step
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("fetch", "orders since {{ inputs.since }}"), inputs=SINCE)
    )  # fmt: skip

    # When: Run now, twice
    first = drive(run_now(api, automation).pk)
    second = drive(run_now(api, automation).pk)

    # Then: both succeed; the first covers everything since the automation exists, the second since the first
    assert (first.status, second.status) == (RunStatus.SUCCEEDED, RunStatus.SUCCEEDED)
    assert first.inputs["since"] == automation.created_at.isoformat()
    assert second.inputs["since"] == first.created_at.isoformat()
    assert second.output == f"orders since {first.created_at.isoformat()}"


def test_a_missing_input_fails_the_step_with_an_error_naming_it(workspace, api, drive):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("fetch", "orders until {{ inputs.until }}"), inputs=SINCE)
    )  # fmt: skip

    run = drive(run_now(api, automation).pk)

    step = StepRun.objects.get(run=run, step_id="fetch")
    assert run.status == RunStatus.FAILED
    assert step.error_code == "TEMPLATE_ERROR"
    assert "input 'until' is not defined" in step.error_message
