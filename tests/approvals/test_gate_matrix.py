"""The gate matrix end to end: 5 autonomy levels × 4 risks through the real executor.

The side effect is a request to a local HTTP server, each case on a path of its
own; for the critical step, a note deleted by a real MCP server's destructive tool.
"""

from __future__ import annotations

import pytest

from approvals import policy
from approvals.models import Approval, ApprovalStatus
from automations.definition import describe_step
from automations.models import DomainEvent
from capabilities import mcp, registry
from capabilities.base import Risk
from tests.factories import audit_types, critical_step, definition, harvest_approved, risk_step
from workspaces.models import Workspace

LEVELS = ["A0", "A1", "A2", "A3", "A4"]
RISKS = ["low", "medium", "high", "critical"]
EXPECTED = {
    #      low        medium     high       critical
    "A0": ("preview", "preview", "preview", "preview"),
    "A1": ("confirm", "confirm", "confirm", "block"),
    "A2": ("allow", "confirm", "confirm", "block"),
    "A3": ("allow", "allow", "confirm", "block"),
    "A4": ("allow", "allow", "allow", "confirm"),
}


@pytest.fixture
def files(workspace, mcp_http):
    """The test MCP server's tools in ``workspace`` as ``files.*`` (the critical step deletes a note there)."""
    harvest_approved(
        mcp.mcp_server_create(workspace=workspace, slug="files", transport="http", url=mcp_http.url)
    )
    return mcp_http


def step_of(risk: str, request, target, path: str):
    """A step of ``risk`` and how many times its side effect happened so far."""
    if risk != "critical":
        return risk_step(risk, target.url(path)), lambda: target.count(path)
    files = request.getfixturevalue("files")
    files.notes.write_text(f"{path}\n")
    return critical_step(path), lambda: 0 if path in files.notes_written() else 1


def test_risk_steps_have_the_risk_they_are_named_for(request, workspace, target):
    for risk in RISKS:
        step, _ = step_of(risk, request, target, f"/named-{risk}")
        action = registry.get_action(step["action"])
        computed, reasons = policy.step_risk(describe_step(step, workspace.id), action.risk_inputs(step["config"]),
                                             recipients=len(action.notifies(step["config"])))  # fmt: skip
        assert computed == Risk.parse(risk), risk
        assert len(reasons) == (1 if risk in ("high", "critical") else 0), reasons


@pytest.mark.parametrize("risk", RISKS)
@pytest.mark.parametrize("autonomy", LEVELS)
def test_gate_matrix_end_to_end(request, drive, workspace, target, path_for, autonomy, risk):
    # The matrix itself, every row reachable: the workspace's admin raised its ceiling to A4
    # (tests/approvals/test_ceilings.py has what the default ceiling A3 does to an A4 definition).
    Workspace.objects.filter(pk=workspace.pk).update(max_autonomy="A4")
    expected = EXPECTED[autonomy][RISKS.index(risk)]
    step_doc, performed = step_of(risk, request, target, path_for(f"{autonomy}-{risk}"))
    automation = drive.automation(definition(step_doc, autonomy=autonomy))

    run = drive.start(automation)

    step = drive.step(run, step_doc["step_id"])
    approvals = Approval.objects.filter(run_id=run.pk)
    if expected == "allow":
        assert run.status == "succeeded", run.error
        assert step.status == "succeeded"
        assert performed() == 1
        assert not approvals.exists()
    elif expected == "confirm":
        assert run.status == "awaiting_approval"
        assert step.status == "awaiting_approval"
        assert performed() == 0
        approval = approvals.get()
        assert approval.status == ApprovalStatus.PENDING
        assert approval.risk == risk
        assert approval.what == step_doc["config"]
        assert approval.step_id == step_doc["step_id"]
        assert "gate.required" in audit_types(run.trace_id)
    elif expected == "preview":
        assert run.status == "succeeded", run.error
        assert step.status == "succeeded"
        assert step.output["data"]["preview"] is True
        assert step.output["data"]["rendered_config"] == step_doc["config"]
        assert performed() == 0
        assert not approvals.exists()
    else:
        assert run.status == "failed"
        assert run.error["code"] == "POLICY_VIOLATION"
        assert step.error_code == "POLICY_VIOLATION"
        assert performed() == 0
        assert not approvals.exists()


def test_confirmed_step_runs_after_approval(request, drive, people, target, path_for):
    Workspace.objects.filter(pk=people.workspace.pk).update(max_autonomy="A4")  # a critical step asks at A4
    step_doc, performed = step_of("critical", request, target, path_for("approved"))
    run = drive.start(drive.automation(definition(step_doc, autonomy="A4")))

    drive.decide(drive.approval(run), people.alice)
    run = drive.resume(run)

    assert run.status == "succeeded", run.error
    assert run.output == {"deleted": 1}
    assert performed() == 1
    assert drive.approval(run).status == ApprovalStatus.CONSUMED
    types = audit_types(run.trace_id)
    assert types.index("approval.approved") < types.index("approval.consumed") < types.index("step.succeeded")


def test_require_approval_gates_even_at_a4(drive, people, target, path_for):
    path = path_for("after-checkpoint")
    doc = definition(
        {"step_id": "checkpoint", "action": "require_approval", "config": {"message": "Ship the release?"}},
        risk_step("low", target.url(path)),
        autonomy="A4",
    )
    run = drive.start(drive.automation(doc))

    assert run.status == "awaiting_approval"
    approval = drive.approval(run)
    assert approval.message == "Ship the release?"
    assert approval.why.startswith("explicit approval step")
    assert target.count(path) == 0

    drive.decide(approval, people.alice)
    run = drive.resume(run)
    assert run.status == "succeeded", run.error
    assert target.count(path) == 1


def test_new_pending_approval_publishes_approval_requested(drive, target, path_for):
    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("event"))), autonomy="A2")
    )

    run = drive.start(automation)

    approval = drive.approval(run)
    event = DomainEvent.objects.get(event_type="approval.requested")
    assert event.source == "approvals"
    assert event.trace_id == run.trace_id
    assert event.chain_depth == run.chain_depth + 1
    assert str(event.parent_run_id) == str(run.pk)
    assert event.payload["approval_id"] == str(approval.pk)
    assert event.payload["run_id"] == str(run.pk)
    assert event.payload["automation_id"] == str(automation.pk)
    assert event.payload["automation_name"] == automation.name
    assert event.payload["step_id"] == "create_item"
    assert event.payload["risk"] == "medium"
    assert event.payload["why"] == approval.why
    assert event.payload["expires_at"] == approval.expires_at.isoformat()


def test_asking_again_for_a_pending_step_publishes_nothing_new(drive, target, path_for):
    from automations.executor import execute_run
    from automations.models import Run

    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("again"))), autonomy="A2"))
    )
    # A redelivered message finds the run parked: the claim refuses it, nothing is asked twice.
    execute_run(str(run.pk))
    # Even forced back through the gate, the existing approval is reused.
    Run.objects.filter(pk=run.pk).update(status="queued")
    execute_run(str(run.pk))

    assert Approval.objects.filter(run_id=run.pk).count() == 1
    assert DomainEvent.objects.filter(event_type="approval.requested").count() == 1
