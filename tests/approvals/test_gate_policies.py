"""The gate's policies through real runs (issue 29): workspace argument rules and a step's own
``policy`` over the rendered config, credentials that always ask, quiet hours. A block sends
nothing; an ask makes an approval whatever the autonomy, and the approver sees why; every match is
audited as ``policy.matched``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from approvals.models import StandingApproval
from audit.models import AuditEvent
from automations.models import RunStatus
from capabilities import credentials
from tests.factories import audit_types, definition, harvest_approved, http_step
from workspaces.services import workspace_update

REFUNDS = [
    {"when": {"path": "json.amount", "lte": 50}, "then": "auto", "reason": "small refunds run"},
    {"when": {"path": "json.amount", "lte": 500}, "then": "ask", "reason": "refunds up to 500 need a human"},
    {
        "when": {"path": "json.amount", "gt": 500},
        "then": "block",
        "reason": "refunds over 500 are never sent",
    },
]
AMOUNT = {"type": "object", "properties": {"amount": {"type": "number"}}}


def refund_step(url: str, **extra) -> dict:
    step = http_step("refund", url, "POST", **extra)
    step["config"]["json"] = {"amount": "{{ inputs.amount }}"}
    return step


def matched(trace_id: str) -> list[dict]:
    return list(AuditEvent.objects.filter(trace_id=trace_id, type="policy.matched").order_by("id").values_list(
        "payload", flat=True))  # fmt: skip


def test_the_refund_example_runs_asks_and_blocks_by_amount(drive, workspace, owner, target, path_for):
    path = path_for("refunds")
    workspace_update(workspace=workspace, user=owner, policies=REFUNDS)
    automation = drive.automation(
        definition(refund_step(target.url(path)), autonomy="A4", inputs_schema=AMOUNT)
    )

    small = drive.start(automation, inputs={"amount": 30})
    medium = drive.start(automation, inputs={"amount": 200})
    large = drive.start(automation, inputs={"amount": 900})

    assert small.status == RunStatus.SUCCEEDED
    assert medium.status == RunStatus.AWAITING_APPROVAL  # at A4, where a medium-risk POST never asks
    approval = drive.approval(medium)
    assert "refunds up to 500 need a human" in approval.why
    assert any("refunds up to 500 need a human" in reason for reason in approval.reasons)
    assert large.status == RunStatus.FAILED
    failed = drive.step(large, "refund")
    assert failed.error_code == "POLICY_VIOLATION"
    assert "refunds over 500 are never sent" in failed.error_message
    assert target.count(path) == 1  # only the small refund left the worker
    assert [(m["rule"], m["then"]) for m in matched(small.trace_id)] == [(0, "auto")]
    assert [(m["rule"], m["then"]) for m in matched(medium.trace_id)] == [(1, "ask")]
    assert [(m["rule"], m["then"], m["reason"]) for m in matched(large.trace_id)] == [
        (2, "block", "refunds over 500 are never sent")
    ]
    assert "gate.blocked" in audit_types(large.trace_id)


def test_an_asked_refund_runs_once_approved(drive, workspace, owner, people, target, path_for):
    path = path_for("approved-refund")
    workspace_update(workspace=workspace, user=owner, policies=REFUNDS)
    automation = drive.automation(
        definition(refund_step(target.url(path)), autonomy="A4", inputs_schema=AMOUNT)
    )
    run = drive.start(automation, inputs={"amount": 120})

    drive.decide(drive.approval(run), people.alice)
    run = drive.resume(run)

    assert run.status == RunStatus.SUCCEEDED
    assert target.count(path) == 1


def test_a_rule_on_a_path_the_config_lacks_changes_nothing(drive, workspace, owner, target, path_for):
    path = path_for("no-amount")
    workspace_update(workspace=workspace, user=owner, policies=REFUNDS)

    run = drive.start(drive.automation(definition(http_step("fetch", target.url(path)))))

    assert run.status == RunStatus.SUCCEEDED
    assert target.count(path) == 1
    assert matched(run.trace_id) == []


def test_a_rule_that_matches_nothing_changes_nothing(drive, workspace, owner, target, path_for):
    path = path_for("unmatched")
    workspace_update(workspace=workspace, user=owner, policies=[
        {"when": {"path": "url", "starts_with": "https://bank.example/"}, "then": "block", "reason": "bank"}])  # fmt: skip

    run = drive.start(drive.automation(definition(http_step("create_item", target.url(path), "POST"))))

    assert run.status == RunStatus.SUCCEEDED
    assert matched(run.trace_id) == []


def test_a_steps_auto_cannot_lift_a_workspace_ask(drive, workspace, owner, target, path_for):
    path = path_for("auto-vs-ask")
    workspace_update(workspace=workspace, user=owner, policies=[
        {"when": {"path": "method", "equals": "POST"}, "then": "ask", "reason": "writes ask here"}])  # fmt: skip
    lifted = http_step("create_item", target.url(path), "POST", policy=[
        {"when": {"path": "method", "exists": True}, "then": "auto", "reason": "trust me"}])  # fmt: skip

    run = drive.start(drive.automation(definition(lifted, autonomy="A4")))

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert "writes ask here" in drive.approval(run).why
    assert target.count(path) == 0
    assert {(m["source"], m["applied"]) for m in matched(run.trace_id)} == {
        ("workspace", True),
        ("step", False),
    }


def test_a_steps_own_policy_may_tighten(drive, workspace, target, path_for):
    path = path_for("step-block")
    tightened = http_step("create_item", target.url(path), "POST", policy=[
        {"when": {"path": "url", "contains": "step-block"}, "then": "block", "reason": "not this endpoint"}])  # fmt: skip

    run = drive.start(drive.automation(definition(tightened, autonomy="A4")))

    assert run.status == RunStatus.FAILED
    assert "not this endpoint" in drive.step(run, "create_item").error_message
    assert target.count(path) == 0


def test_a_block_fails_the_step_even_at_a0(drive, workspace, owner, target, path_for):
    path = path_for("a0-block")
    workspace_update(workspace=workspace, user=owner, policies=[
        {"when": {"path": "method", "equals": "POST"}, "then": "block", "reason": "no writes"}])  # fmt: skip

    run = drive.start(
        drive.automation(definition(http_step("create_item", target.url(path), "POST"), autonomy="A0"))
    )

    assert run.status == RunStatus.FAILED
    assert drive.step(run, "create_item").error_code == "POLICY_VIOLATION"


def test_rules_are_read_at_run_time_not_frozen_at_save(drive, workspace, owner, target, path_for):
    path = path_for("late-rule")
    automation = drive.automation(definition(http_step("create_item", target.url(path), "POST")))
    workspace_update(workspace=workspace, user=owner, policies=[
        {"when": {"path": "method", "equals": "POST"}, "then": "ask", "reason": "added after the save"}])  # fmt: skip

    run = drive.start(automation)

    assert run.status == RunStatus.AWAITING_APPROVAL


def test_a_policy_ask_is_not_covered_by_a_standing_approval(
    drive, workspace, owner, people, target, path_for
):
    from approvals.services import standing_approval_create

    path = path_for("standing-vs-policy")
    automation = drive.automation(
        definition(http_step("create_item", target.url(path), "POST"), autonomy="A2")
    )
    standing_approval_create(workspace=workspace, automation_id=automation.pk, capability_id="http_request",
                             user=people.alice, max_uses=5, expires_at=timezone.now() + timedelta(hours=1))  # fmt: skip
    covered = drive.start(automation)  # the matrix asks at A2; the standing approval answers
    workspace_update(workspace=workspace, user=owner, policies=[
        {"when": {"path": "method", "equals": "POST"}, "then": "ask", "reason": "every write, by a person"}])  # fmt: skip

    asked = drive.start(automation)

    assert covered.status == RunStatus.SUCCEEDED
    assert asked.status == RunStatus.AWAITING_APPROVAL
    assert StandingApproval.objects.get().uses == 1


def test_a_credential_that_always_asks_gates_every_step_using_it(drive, workspace, owner, target, path_for):
    path = path_for("always-asks")
    credentials.credential_create(workspace=workspace, name="payments", kind="bearer", secret={"token": "t-123456"},
                                  allowed_destinations=["127.0.0.1"], approval_always=True)  # fmt: skip
    credentials.credential_create(workspace=workspace, name="plain", kind="bearer", secret={"token": "t-654321"},
                                  allowed_destinations=["127.0.0.1"])  # fmt: skip
    uses = http_step("fetch", target.url(path))
    uses["config"]["credential"] = "payments"
    plain = http_step("fetch", target.url(path))
    plain["config"]["credential"] = "plain"

    asked = drive.start(drive.automation(definition(uses, autonomy="A4")))
    ran = drive.start(drive.automation(definition(plain, autonomy="A4")))

    assert asked.status == RunStatus.AWAITING_APPROVAL  # a low-risk GET at A4
    assert "credential payments always asks" in drive.approval(asked).why
    assert ran.status == RunStatus.SUCCEEDED
    assert target.count(path) == 1


@pytest.fixture
def clock(monkeypatch):
    """Quiet hours read this fixed time instead of the real clock."""
    now = {"at": datetime(2026, 1, 15, 23, 0, tzinfo=UTC)}  # 00:00 in Berlin
    monkeypatch.setattr("automations.gate_policies.current_time", lambda: now["at"])
    return now


def test_inside_quiet_hours_a_medium_risk_step_asks_and_a_low_risk_one_runs(drive, workspace, owner, clock,
                                                                             target, path_for):  # fmt: skip
    write, read = path_for("quiet-write"), path_for("quiet-read")
    workspace_update(workspace=workspace, user=owner,
                     quiet_hours={"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"})  # fmt: skip
    writes = drive.automation(definition(http_step("create_item", target.url(write), "POST"), autonomy="A4"))
    reads = drive.automation(definition(http_step("fetch", target.url(read)), autonomy="A4"))

    night_write, night_read = drive.start(writes), drive.start(reads)
    clock["at"] = datetime(2026, 1, 16, 9, 0, tzinfo=UTC)  # 10:00 in Berlin
    day_write = drive.start(writes)

    assert night_write.status == RunStatus.AWAITING_APPROVAL
    assert "quiet hours" in drive.approval(night_write).why
    assert night_read.status == RunStatus.SUCCEEDED
    assert day_write.status == RunStatus.SUCCEEDED
    assert target.count(write) == 1
    assert target.count(read) == 1


def test_the_claim_brings_the_rules_so_a_step_no_rule_matches_costs_no_query(
    drive, workspace, owner, target, path_for, django_assert_num_queries
):
    from django.db import transaction

    from automations import claim, gate_policies, steps
    from automations.services import run_create

    workspace_update(workspace=workspace, user=owner, policies=REFUNDS,
                     quiet_hours={"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"})  # fmt: skip
    automation = drive.automation(definition(http_step("fetch", target.url(path_for("cost")))))
    run = run_create(automation=automation, inputs={}, user=owner).run
    with transaction.atomic():
        claimed = claim.claim(str(run.pk), "host:1")
    assert claimed is not None
    prepared = steps.prepare(claimed, claimed.snapshot["plan"][0], 1)

    with django_assert_num_queries(0):
        verdict = gate_policies.assess(claimed, prepared, now=datetime(2026, 1, 15, 23, 0, tzinfo=UTC))

    assert verdict.decision is None  # a low-risk GET at midnight, no amount in its config
    assert claimed.workspace.policies == REFUNDS


def test_a_tool_of_an_mcp_server_whose_credential_always_asks_asks(drive, workspace, mcp_http, tmp_path):
    from capabilities import mcp

    token = credentials.credential_create(workspace=workspace, name="files-token", kind="bearer",
                                          secret={"token": "t-abcdef123456"}, approval_always=True)  # fmt: skip
    harvest_approved(mcp.mcp_server_create(workspace=workspace, slug="files", transport="http", url=mcp_http.url,
                                           credential=token))  # fmt: skip
    document = tmp_path / "doc.txt"
    document.write_text("hello")
    read = {"step_id": "read", "action": "call_capability",
            "config": {"capability": "files.read_file", "args": {"path": str(document)}}}  # fmt: skip

    run = drive.start(drive.automation(definition(read, autonomy="A4")))  # a read-only tool at A4

    assert run.status == RunStatus.AWAITING_APPROVAL
    assert "credential files-token always asks" in drive.approval(run).why
