"""A definition without ``execution.autonomy`` is gated at its workspace's default autonomy, read
when the worker gates the step (docs/concepts.md), not frozen when the automation was saved."""

from __future__ import annotations

from automations.models import RunStatus
from tests.factories import definition, risk_step
from workspaces.services import workspace_update


def test_a_step_gates_at_the_workspace_default_when_the_definition_sets_none(drive, workspace, owner,
                                                                             target, path_for):  # fmt: skip
    path = path_for("default-autonomy")
    automation = drive.automation(definition(risk_step("medium", target.url(path))))
    assert "autonomy" not in automation.definition.get("execution", {})

    allowed = drive.start(automation)  # the default A3 allows a medium-risk step
    workspace_update(workspace=workspace, user=owner, default_autonomy="A2")  # no re-save of the automation
    gated = drive.start(automation)

    assert allowed.status == RunStatus.SUCCEEDED
    assert gated.status == RunStatus.AWAITING_APPROVAL
    assert "at autonomy A2" in drive.approval(gated).why
    assert target.count(path) == 1


def test_an_automation_that_sets_its_autonomy_ignores_the_workspace_default(drive, workspace, owner,
                                                                            target, path_for):  # fmt: skip
    path = path_for("pinned-autonomy")
    workspace_update(workspace=workspace, user=owner, default_autonomy="A0")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A3"))

    run = drive.start(automation)

    assert run.status == RunStatus.SUCCEEDED
    assert target.count(path) == 1


def test_a_parked_run_gates_its_remaining_steps_at_the_default_of_the_time(drive, workspace, owner, people,
                                                                         target, path_for):  # fmt: skip
    path = path_for("after-sign-off")
    sign_off = {"step_id": "sign_off", "action": "require_approval", "config": {"message": "go on?"}}
    run = drive.start(drive.automation(definition(sign_off, risk_step("medium", target.url(path)))))
    assert run.status == RunStatus.AWAITING_APPROVAL

    workspace_update(workspace=workspace, user=owner, default_autonomy="A0")
    drive.decide(drive.approval(run), people.alice)
    run = drive.resume(run)

    assert run.status == RunStatus.SUCCEEDED
    assert target.count(path) == 0  # previewed at A0, never sent
    assert "dry run at autonomy A0" in drive.step(run, "create_item").output["summary"]
