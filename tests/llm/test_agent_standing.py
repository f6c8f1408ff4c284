"""A standing approval's ``arg_constraint`` reads an agent tool call's own arguments (issue 29): a
constraint written for the step's flat config (``{"properties": {"to": ...}}``) must not match every
tool call just because the call is presented as ``{"tool", "args"}``. (send_email, not http_request: an
agent-chosen URL to this test's loopback server always asks a human, standing approval or not.)"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core import mail
from django.utils import timezone

from approvals.models import Approval, StandingApproval
from approvals.services import standing_approval_create
from tests.factories import member
from tests.llm_server import reply_text, reply_tool_call
from workspaces.models import Role

from .test_agent_task import agent, automation_with, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def granted(workspace, owner):
    automation = automation_with(workspace, owner, agent(tools=["send_email"]), autonomy="A2")
    approver = member("approver", workspace, Role.APPROVER)
    standing_approval_create(
        workspace=workspace, automation_id=automation.pk, capability_id="send_email", max_uses=5,
        expires_at=timezone.now() + timedelta(hours=1), user=approver,
        arg_constraint={"type": "object", "properties": {"to": {"items": {"pattern": "@example\\.com$"}}}},
    )  # fmt: skip
    return automation


def _mail(to: str) -> dict:
    return {"to": [to], "subject": "hello", "body": "hi"}


def test_a_tool_call_outside_the_constraint_asks(llm, granted, operator, drive):
    llm.script(reply_tool_call("send_email", _mail("ada@elsewhere.test")))

    run = start(granted, operator, drive)

    assert run.status == "awaiting_approval"
    assert mail.outbox == []
    assert Approval.objects.get(run_id=run.pk).step_key == "plan:0:agent#t0"
    assert StandingApproval.objects.get().uses == 0


def test_a_tool_call_within_the_constraint_is_covered(llm, granted, operator, drive):
    llm.script(reply_tool_call("send_email", _mail("ada@example.com")), reply_text("sent"))

    run = start(granted, operator, drive)

    assert run.status == "succeeded", run.error
    assert [message.to for message in mail.outbox] == [["ada@example.com"]]
    assert not Approval.objects.exists()
    assert StandingApproval.objects.get().uses == 1
