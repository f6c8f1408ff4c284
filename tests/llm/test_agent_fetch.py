"""What an agent may fetch (issue 32): a model-chosen URL that reaches a non-public address
waits for a human whichever allowlist admits it (here the deployment's, which opens the
tests' loopback servers), a fetch nobody approved reaches public addresses only (redirects
included), and a caller's Host header is never sent."""

from __future__ import annotations

import pytest
from django.core import mail

from approvals.models import Approval
from approvals.services import approval_decide
from automations import services
from automations.agent_tools import NON_PUBLIC_REASON
from capabilities.base import ActionContext, ErrorCode, StepFailure
from capabilities.builtin import http_request
from config.errors import ServiceError
from tests.factories import member
from tests.llm.test_agent_task import agent, automation_with, start, step
from tests.llm_server import reply_text, reply_tool_call
from workspaces.models import Role

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("tool", "function", "autonomy"), [("core.http_get", "core_http_get", "A4"),
                                                            ("core.http_get", "core_http_get", "A3"),
                                                            ("http_request", "http_request", "A4")])  # fmt: skip
def test_an_agent_chosen_url_to_a_non_public_address_waits_for_a_human(
    llm, workspace, owner, operator, drive, http_server, tool, function, autonomy
):
    approver = member("approver", workspace, Role.APPROVER)
    automation = automation_with(workspace, owner, agent(tools=[tool]), autonomy=autonomy)
    args = {"url": http_server.url + "/internal"}
    llm.script(reply_tool_call(function, args))

    run = start(automation, operator, drive)

    assert run.status == "awaiting_approval"
    assert http_server.requests == []  # nothing was fetched before a human looked
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.what == {"tool": tool, "args": args}
    assert NON_PUBLIC_REASON in approval.reasons

    approval_decide(approval_id=approval.pk, user=approver, decision="approve")
    services.run_resume(run_id=str(run.pk))
    llm.script(reply_text("fetched"))
    run = drive(run.pk)

    assert run.status == "succeeded", run.error
    assert [r["path"] for r in http_server.requests] == ["/internal"]


def test_a_denied_non_public_fetch_fails_the_step_and_fetches_nothing(llm, workspace, owner, operator, drive,
                                                                      http_server):  # fmt: skip
    approver = member("approver", workspace, Role.APPROVER)
    automation = automation_with(workspace, owner, agent(tools=["core.http_get"]), autonomy="A4")
    llm.script(reply_tool_call("core_http_get", {"url": http_server.url + "/x"}))
    run = start(automation, operator, drive)
    approval_decide(
        approval_id=Approval.objects.get(run_id=run.pk).pk,
        user=approver,
        decision="deny",
        reason="internal host",
    )
    services.run_resume(run_id=str(run.pk))

    run = drive(run.pk)

    assert run.status == "failed"
    assert step(run).output["error"]["code"] == "APPROVAL_DENIED"
    assert http_server.requests == []


def _ctx(**extra) -> ActionContext:
    return ActionContext(run_id="r", step_id="s", attempt=1, workspace_id=1, trace_id="t", idempotency_key="k",
                         timeout_seconds=5, **extra)  # fmt: skip


def test_an_unapproved_agent_fetch_reaches_public_addresses_only(http_server, settings):
    """Its redirect hops included: the gateway runs it with ``public_egress_only``."""
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]

    with pytest.raises(StepFailure) as info:
        http_request.ACTION.handler(_ctx(public_egress_only=True, egress_allowlist=("127.0.0.1",)),
                                    {"url": http_server.url + "/x"})  # fmt: skip

    assert info.value.code == ErrorCode.POLICY_VIOLATION
    assert http_server.requests == []
    assert http_request.ACTION.handler(
        _ctx(), {"url": http_server.url + "/y"}
    ).ok  # a step's own URL: allowlisted


@pytest.mark.parametrize("name", ["Host", "host", "HOST", " Host"])
def test_a_callers_host_header_is_never_sent(http_server, name):
    port = http_server.url.rsplit(":", 1)[1]

    envelope = http_request.ACTION.handler(_ctx(), {"url": http_server.url + "/h",
                                                    "headers": {name: "169.254.169.254", "X-Keep": "1"}})  # fmt: skip

    assert envelope.ok
    (seen,) = http_server.requests
    assert seen["headers"]["Host"] == f"127.0.0.1:{port}"
    assert seen["headers"]["X-Keep"] == "1"


def test_an_agent_tool_call_with_a_host_header_has_it_dropped(
    llm, workspace, owner, operator, drive, http_server
):
    approver = member("approver", workspace, Role.APPROVER)
    automation = automation_with(workspace, owner, agent(tools=["core.http_get"]), autonomy="A4")
    llm.script(
        reply_tool_call("core_http_get", {"url": http_server.url + "/h", "headers": {"Host": "metadata"}})
    )
    run = start(automation, operator, drive)
    approval_decide(approval_id=Approval.objects.get(run_id=run.pk).pk, user=approver, decision="approve")
    services.run_resume(run_id=str(run.pk))
    llm.script(reply_text("ok"))

    run = drive(run.pk)

    assert run.status == "succeeded", run.error
    assert http_server.requests[0]["headers"]["Host"] != "metadata"


@pytest.mark.parametrize("name", ["Host", "host", "HOST"])
def test_an_http_request_definition_with_a_host_header_is_refused_at_save(workspace, owner, name):
    step_ = {"step_id": "call", "action": "http_request",
             "config": {"url": "https://api.example.com/", "headers": {name: "internal.example"}}}  # fmt: skip
    definition = {"schema_version": "1.0", "name": "host header", "plan": [step_]}

    with pytest.raises(ServiceError) as info:
        services.automation_create(workspace=workspace, definition=definition, user=owner)

    assert info.value.http_status == 400
    assert [(e["path"], e["code"]) for e in info.value.errors] == [
        (f"/plan/0/config/headers/{name}", "header_not_allowed")
    ]


@pytest.fixture
def senders(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "robot@corp.example"
    settings.AUTOPLANE_EMAIL_ALLOWED_FROM = []


def test_an_agent_choosing_a_spoofed_sender_gets_a_policy_violation(
    llm, workspace, owner, operator, drive, senders
):
    agent = {"step_id": "agent", "action": "agent_task", "output_as": "agent",
             "config": {"prompt": "mail the team", "tools": ["send_email"]}}  # fmt: skip
    automation = services.automation_create(workspace=workspace, user=owner,
                                            definition={"schema_version": "1.0", "name": "mail", "plan": [agent], "execution": {"autonomy": "A4"}})  # fmt: skip
    approver = member("approver", workspace, Role.APPROVER)
    args = {"to": ["a@example.com"], "subject": "s", "body": "b", "from": "ceo@corp.example"}
    llm.script(reply_tool_call("send_email", args), reply_text("could not send"))

    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)
    for approval in Approval.objects.filter(run_id=run.pk, status="pending"):
        approval_decide(approval_id=approval.pk, user=approver, decision="approve")
        services.run_resume(run_id=str(run.pk))
        run = drive(run.pk)

    assert run.status == "succeeded", run.error
    tool_message = llm.requests[-1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert "POLICY_VIOLATION" in tool_message["content"]
    assert mail.outbox == []
