"""A standing approval's ``arg_constraint`` reads an agent tool call's own arguments (issue 29): a
constraint written for the step's flat config (``{"properties": {"url": ...}}``) must not match every
tool call just because the call is presented as ``{"tool", "args"}``."""

from __future__ import annotations

from datetime import timedelta

import pytest
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
    automation = automation_with(workspace, owner, agent(tools=["http_request"]), autonomy="A2")
    approver = member("approver", workspace, Role.APPROVER)
    standing_approval_create(
        workspace=workspace, automation_id=automation.pk, capability_id="http_request", max_uses=5,
        expires_at=timezone.now() + timedelta(hours=1), user=approver,
        arg_constraint={"type": "object", "properties": {"url": {"pattern": "/allowed$"}}},
    )  # fmt: skip
    return automation


def test_a_tool_call_outside_the_constraint_asks(llm, granted, operator, drive, http_server):
    llm.script(reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/elsewhere"}))

    run = start(granted, operator, drive)

    assert run.status == "awaiting_approval"
    assert http_server.requests == []
    assert Approval.objects.get(run_id=run.pk).step_key == "plan:0:agent#t0"
    assert StandingApproval.objects.get().uses == 0


def test_a_tool_call_within_the_constraint_is_covered(llm, granted, operator, drive, http_server):
    llm.script(reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/allowed"}),
               reply_text("posted"))  # fmt: skip

    run = start(granted, operator, drive)

    assert run.status == "succeeded", run.error
    assert len(http_server.requests) == 1
    assert not Approval.objects.exists()
    assert StandingApproval.objects.get().uses == 1
