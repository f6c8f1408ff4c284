"""An agent's tool calls meet the workspace's policies as steps do (issue 29): the rules see the
tool's own arguments, so a refund an agent sends through ``http_request`` is blocked or asked for
exactly as the same refund in an ``http_request`` step."""

from __future__ import annotations

import pytest

from approvals.models import Approval
from audit.models import AuditEvent
from automations import services
from tests.llm_server import reply_tool_call
from workspaces.services import workspace_update

pytestmark = pytest.mark.django_db

REFUNDS = [
    {"when": {"path": "json.amount", "lte": 50}, "then": "auto", "reason": "small refunds run"},
    {"when": {"path": "json.amount", "lte": 500}, "then": "ask", "reason": "refunds up to 500 need a human"},
    {
        "when": {"path": "json.amount", "gt": 500},
        "then": "block",
        "reason": "refunds over 500 are never sent",
    },
]


def _agent_run(workspace, owner, operator, drive):
    definition = {"schema_version": "1.0", "name": "refund agent", "execution": {"autonomy": "A4"},
                  "plan": [{"step_id": "agent", "action": "agent_task",
                            "config": {"prompt": "Refund the customer", "tools": ["http_request"]}}]}  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition, user=owner)
    return drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)


def test_a_blocked_refund_tool_call_fails_the_step_and_is_never_sent(llm, workspace, owner, operator, drive,
                                                                     http_server):  # fmt: skip
    workspace_update(workspace=workspace, user=owner, policies=REFUNDS)
    llm.script(reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/refunds",
                                                "json": {"amount": 900}}))  # fmt: skip

    run = _agent_run(workspace, owner, operator, drive)

    assert (run.status, run.error["code"]) == ("failed", "POLICY_VIOLATION")  # as a blocked step does
    assert "refunds over 500 are never sent" in run.error["message"]
    assert http_server.requests == []
    row = AuditEvent.objects.get(type="policy.matched")
    assert (row.payload["tool"], row.payload["then"]) == ("http_request", "block")


def test_an_asked_refund_tool_call_parks_for_approval_at_a4(
    llm, workspace, owner, operator, drive, http_server
):
    workspace_update(workspace=workspace, user=owner, policies=REFUNDS)
    llm.script(reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/refunds",
                                                "json": {"amount": 200}}))  # fmt: skip

    run = _agent_run(workspace, owner, operator, drive)

    assert run.status == "awaiting_approval"
    assert http_server.requests == []
    assert "refunds up to 500 need a human" in Approval.objects.get(run_id=run.pk).why
