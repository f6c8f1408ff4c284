"""send_email's ``from`` (issue 32): only DEFAULT_FROM_EMAIL or a sender AUTOPLANE_EMAIL_ALLOWED_FROM
lists; any other is refused at save (400 ``sender_not_allowed``), at run for a templated one
(``POLICY_VIOLATION``, nothing sent); as an agent's tool argument: tests/llm/test_agent_fetch.py."""

from __future__ import annotations

import pytest
from django.core import mail

from approvals.models import Approval
from approvals.services import approval_decide
from automations import services
from capabilities.base import ActionContext, ErrorCode, StepFailure
from capabilities.builtin import send_email
from config.errors import ServiceError
from tests.factories import member
from workspaces.models import Role

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def senders(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.DEFAULT_FROM_EMAIL = "Autoplane <robot@corp.example>"
    settings.AUTOPLANE_EMAIL_ALLOWED_FROM = ["alerts@corp.example", "@notify.corp.example"]


def _email(sender: str) -> dict:
    return {"step_id": "mail", "action": "send_email",
            "config": {"to": ["a@example.com"], "subject": "s", "body": "b", "from": sender}}  # fmt: skip


def _definition(*steps, **extra) -> dict:
    return {"schema_version": "1.0", "name": "mail", "plan": list(steps), **extra}


@pytest.mark.parametrize(
    "sender",
    [
        "ceo@corp.example",
        "robot@corp.example.evil",
        "alerts@corp.example.",
        "x@sub.notify.corp.example",
        "x@evilnotify.corp.example",
        "ROBOT@evil.example",
    ],
)
def test_a_literal_sender_outside_the_allowed_ones_is_refused_at_save(workspace, owner, sender):
    with pytest.raises(ServiceError) as info:
        services.automation_create(workspace=workspace, definition=_definition(_email(sender)), user=owner)

    assert info.value.http_status == 400
    assert [(e["path"], e["code"]) for e in info.value.errors] == [
        ("/plan/0/config/from", "sender_not_allowed")
    ]


@pytest.mark.parametrize(
    "sender",
    ["robot@corp.example", "ROBOT@corp.example", "alerts@corp.example", "anyone@notify.corp.example"],
)
def test_allowed_senders_are_saved_and_sent_from(workspace, owner, sender):
    services.automation_create(workspace=workspace, definition=_definition(_email(sender)), user=owner)
    ctx = ActionContext(run_id="r", step_id="mail", attempt=1, workspace_id=1, trace_id="t", idempotency_key="k",
                        timeout_seconds=5)  # fmt: skip

    assert send_email.ACTION.handler(ctx, _email(sender)["config"]).ok
    assert mail.outbox[-1].from_email == sender


def test_a_templated_sender_is_checked_at_run_and_nothing_is_sent(workspace, owner, operator, drive):
    definition = _definition(_email("{{ inputs.sender }}"),
                             inputs={"schema": {"type": "object", "properties": {"sender": {"type": "string"}}}},
                             execution={"autonomy": "A4"})  # fmt: skip
    automation = services.automation_create(workspace=workspace, definition=definition, user=owner)
    approver = member("approver", workspace, Role.APPROVER)

    run = drive(
        services.run_create(
            automation=automation, inputs={"sender": "ceo@corp.example"}, user=operator
        ).run.pk
    )
    for approval in Approval.objects.filter(run_id=run.pk, status="pending"):  # send_email may be gated
        approval_decide(approval_id=approval.pk, user=approver, decision="approve")
        services.run_resume(run_id=str(run.pk))
        run = drive(run.pk)

    assert run.status == "failed"
    assert run.steps.get(step_id="mail").output["error"]["code"] == ErrorCode.POLICY_VIOLATION
    assert mail.outbox == []


def test_the_handler_refuses_a_sender_it_was_given_directly():
    ctx = ActionContext(run_id="r", step_id="mail", attempt=1, workspace_id=1, trace_id="t", idempotency_key="k",
                        timeout_seconds=5)  # fmt: skip
    with pytest.raises(StepFailure) as info:
        send_email.ACTION.handler(ctx, _email("ceo@corp.example")["config"])

    assert info.value.code == ErrorCode.POLICY_VIOLATION
    assert mail.outbox == []
