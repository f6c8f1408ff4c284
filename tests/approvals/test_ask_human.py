"""``ask_human``: a question is an approval; the run waits, an answer (or the timeout's option)
becomes the step's output for ``output_as`` and ``when``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from approvals.models import Approval, ApprovalDecision, ApprovalStatus
from approvals.services import approvals_expire
from audit.models import AuditEvent
from config.errors import ServiceError
from tests.factories import audit_types, definition, transform
from workspaces.models import Workspace

QUESTION = {
    "step_id": "choose", "action": "ask_human", "output_as": "choice",
    "config": {"question": "Ship the release?", "allow_freetext": True, "timeout_seconds": 3600, "on_timeout": "later",
               "options": [{"value": "now", "label": "Ship now"}, {"value": "later", "label": "Wait"}]},
}  # fmt: skip
SHIP = transform("ship", {"shipped": "{{ choice.value }}", "note": "{{ choice.freetext }}",
                          "by": "{{ choice.decided_by }}"}, when="{{ choice.value == 'now' }}")  # fmt: skip


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def asked(drive, people):
    run = drive.start(drive.automation(definition(QUESTION, SHIP, name="release")))
    return run, drive.approval(run)


def test_a_question_parks_the_run_and_is_a_pending_approval(people, asked):
    run, approval = asked

    assert run.status == "awaiting_approval"
    listed = _client(people.alice).get("/api/v1/approvals", {"status": "pending"}).json()["results"]
    assert [a["id"] for a in listed] == [str(approval.pk)]
    assert listed[0]["action"] == "ask_human"
    assert listed[0]["message"] == "Ship the release?"
    waits = approval.expires_at - approval.created_at  # its own timeout, not the run's 24 h
    assert timedelta(seconds=3599) < waits < timedelta(seconds=3601)


def test_an_answer_is_the_step_output(drive, people, asked):
    run, approval = asked

    response = _client(people.alice).post(f"/api/v1/approvals/{approval.pk}/decide",
                                          {"decision": "answer", "value": "now", "freetext": "go go"}, format="json")  # fmt: skip

    assert response.status_code == 200, response.content
    assert response.json()["answer"] == {
        "value": "now",
        "freetext": "go go",
        "decided_by": "alice",
        "timed_out": False,
    }
    run = drive.resume(run)
    assert run.status == "succeeded"
    assert drive.step(run, "choose").output["data"] == {
        "value": "now",
        "freetext": "go go",
        "decided_by": "alice",
    }
    assert drive.step(run, "ship").output["data"] == {"shipped": "now", "note": "go go", "by": "alice"}
    assert "approval.answered" in audit_types(run.trace_id)


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "answer", "value": "never"},  # not offered
        {"decision": "answer", "value": True},  # not offered (and not the string)
        {"decision": "answer"},  # nothing
        {"decision": "answer", "value": "now", "freetext": 5},
        {"decision": "approve"},  # a question is answered, not approved
        {"decision": "answer", "value": "now", "bogus": 1},
        {"decision": "answer", "value": "now", "edited_config": {}},
        {"decision": "maybe"},
    ],
)
def test_bad_answers_are_refused_and_nothing_is_recorded(people, asked, body):
    _, approval = asked

    response = _client(people.alice).post(f"/api/v1/approvals/{approval.pk}/decide", body, format="json")

    assert response.status_code == 400
    assert "INVALID_ARGUMENT" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert not ApprovalDecision.objects.exists()


def test_free_text_only_when_allowed(drive, people):
    question = {**QUESTION, "config": {**QUESTION["config"], "allow_freetext": False}}
    run = drive.start(drive.automation(definition(question, name="strict")))
    approval = drive.approval(run)

    response = _client(people.alice).post(f"/api/v1/approvals/{approval.pk}/decide",
                                          {"decision": "answer", "value": "now", "freetext": "hm"}, format="json")  # fmt: skip

    assert response.status_code == 400
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_input_schema_checks_the_value(drive, people):
    question = {"step_id": "amount", "action": "ask_human", "output_as": "amount",
                "config": {"question": "How many?", "timeout_seconds": 600, "on_timeout": 1,
                           "input_schema": {"type": "integer", "minimum": 1, "maximum": 10}}}  # fmt: skip
    run = drive.start(drive.automation(definition(question, name="count")))
    approval = drive.approval(run)
    client = _client(people.bob)

    assert client.post(f"/api/v1/approvals/{approval.pk}/decide", {"decision": "answer", "value": 11},
                       format="json").status_code == 400  # fmt: skip
    ok = client.post(
        f"/api/v1/approvals/{approval.pk}/decide", {"decision": "answer", "value": 7}, format="json"
    )
    assert ok.status_code == 200
    assert drive.resume(run).status == "succeeded"


def test_a_timeout_takes_the_declared_option_and_says_so(drive, people, asked):
    run, approval = asked

    approvals_expire(now=approval.expires_at + timedelta(seconds=1))

    run = drive.resume(run)
    assert run.status == "succeeded"
    assert drive.step(run, "choose").output["data"] == {"value": "later", "freetext": "", "decided_by": None}
    assert drive.step(run, "ship").status == "skipped"
    (event,) = AuditEvent.objects.filter(type="approval.answer_timed_out")
    assert "took 'later'" in event.summary
    late = _client(people.alice).post(f"/api/v1/approvals/{approval.pk}/decide",
                                      {"decision": "answer", "value": "now"}, format="json")  # fmt: skip
    assert late.status_code == 409  # an answer after the timeout


def test_roles_and_four_eyes_apply(people, asked):
    _, approval = asked
    body = {"decision": "answer", "value": "now"}

    assert (
        _client(people.viewer)
        .post(f"/api/v1/approvals/{approval.pk}/decide", body, format="json")
        .status_code
        == 403
    )
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    # the owner wrote the automation: four-eyes keeps them from answering
    assert (
        _client(people.owner).post(f"/api/v1/approvals/{approval.pk}/decide", body, format="json").status_code
        == 403
    )
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


@pytest.mark.parametrize(
    "config",
    [
        {
            "question": "q",
            "timeout_seconds": 600,
            "options": [{"value": "a", "label": "A"}],
            "on_timeout": "b",
        },
        {"question": "q", "timeout_seconds": 600, "options": [{"value": "a", "label": "A"}]},
        {"question": "q", "timeout_seconds": 600, "on_timeout": "a"},
        {"question": "q", "timeout_seconds": 5, "options": [{"value": "a", "label": "A"}], "on_timeout": "a"},
    ],
)
def test_malformed_questions_are_refused_on_save(drive, people, config):
    with pytest.raises(ServiceError):
        drive.automation(definition({"step_id": "q", "action": "ask_human", "config": config}))


def test_an_approver_answers_in_the_admin(drive, people, asked):
    from django.test import Client

    run, approval = asked
    people.alice.is_staff = True
    people.alice.save(update_fields=["is_staff"])
    from django.contrib.auth.models import Permission as AuthPermission

    people.alice.user_permissions.add(AuthPermission.objects.get(codename="view_approval"))
    client = Client()
    client.force_login(people.alice)
    page = client.get(f"/admin/approvals/approval/{approval.pk}/change/").content.decode()
    assert 'id="answer-form"' in page
    assert "Ship the release?" in page
    assert "Ship now" in page
    assert 'id="approve-button"' not in page  # a question is answered, not approved

    client.post(f"/admin/approvals/approval/{approval.pk}/answer/", {"option": "0", "freetext": "ok"})

    assert Approval.objects.get(pk=approval.pk).answer == {"value": "now", "freetext": "ok", "decided_by": "alice",
                                                           "timed_out": False}  # fmt: skip
    assert (
        'id="approval-answer"'
        in client.get(f"/admin/approvals/approval/{approval.pk}/change/").content.decode()
    )
    assert drive.resume(run).status == "succeeded"
