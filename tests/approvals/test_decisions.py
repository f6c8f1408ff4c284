"""Deciding: roles, four-eyes, quorum, deny, expiry, resuming the run, one-click links."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.test import Client
from django.utils import timezone

from approvals.models import Approval, ApprovalDecision, ApprovalStatus, ConsumedNonce
from approvals.services import ApprovalError, approval_link_create, approvals_expire
from audit.models import AuditEvent
from automations.models import Run
from tests.factories import audit_types, definition, http_step, risk_step
from workspaces.models import Workspace


@pytest.fixture
def parked(drive, target, path_for):
    path, cleanup = path_for("decide"), path_for("cleanup")
    doc = definition(
        risk_step("medium", target.url(path)),
        on_failure=[http_step("cleanup", target.url(cleanup))],
        autonomy="A2",
    )
    run = drive.start(drive.automation(doc))
    assert run.status == "awaiting_approval"
    return SimpleNamespace(run=run, path=path, cleanup=cleanup, approval=drive.approval(run))


def _refused(drive, approval, user, decision="approve", reason="") -> ApprovalError:
    with pytest.raises(ApprovalError) as refused:
        drive.decide(approval, user, decision, reason)
    return refused.value


def test_approve_resumes_the_run_by_task_name_after_commit(drive, people, parked, sent,
                                                           django_capture_on_commit_callbacks):  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        approval = drive.decide(parked.approval, people.alice, reason="looks right")

    assert approval.status == ApprovalStatus.APPROVED
    assert approval.token
    assert ("autoplane.resume_run", [str(parked.run.pk), "approval granted"]) in sent
    event = AuditEvent.objects.get(type="approval.approved")
    assert event.actor == "user:alice"
    assert event.trace_id == parked.run.trace_id
    assert approval.token not in str(event.payload)


def test_deny_fails_the_step_with_approval_denied_and_runs_on_failure(drive, people, target, parked, sent,
                                                                      django_capture_on_commit_callbacks):  # fmt: skip
    with django_capture_on_commit_callbacks(execute=True):
        approval = drive.decide(parked.approval, people.alice, "deny", reason="wrong customer")
    assert approval.status == ApprovalStatus.DENIED
    assert ("autoplane.resume_run", [str(parked.run.pk), "approval denied"]) in sent

    run = drive.resume(parked.run)

    assert run.status == "failed"
    assert run.error["code"] == "APPROVAL_DENIED"
    assert drive.step(run, "create_item").error_code == "APPROVAL_DENIED"
    assert drive.step(run, "cleanup", phase="on_failure").status == "succeeded"
    assert target.count(parked.path) == 0
    assert target.count(parked.cleanup) == 1
    assert AuditEvent.objects.get(type="approval.denied").payload["reason"] == "wrong customer"


def test_deny_requires_a_reason(drive, people, parked):
    error = _refused(drive, parked.approval, people.alice, "deny", reason="   ")

    assert (error.code, error.http_status) == ("INVALID_ARGUMENT", 400)
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


@pytest.mark.parametrize("who", ["operator", "viewer", "outsider"])
def test_only_approvers_of_the_workspace_may_decide(drive, people, parked, who):
    error = _refused(drive, parked.approval, getattr(people, who))

    assert (error.code, error.http_status) == ("PERMISSION_DENIED", 403)
    assert not ApprovalDecision.objects.exists()


def test_a_decided_approval_cannot_be_decided_again(drive, people, parked):
    drive.decide(parked.approval, people.alice)

    error = _refused(drive, parked.approval, people.bob, "deny", reason="too late")

    assert (error.code, error.http_status) == ("CONFLICT", 409)
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.APPROVED


def test_quorum_of_two_needs_two_distinct_approvers(drive, people, target, path_for):
    path = path_for("quorum")
    run = drive.start(
        drive.automation(
            definition(risk_step("medium", target.url(path)) | {"approvals_required": 2}, autonomy="A2")
        )
    )
    approval = drive.approval(run)
    assert approval.approvals_required == 2

    after_one = drive.decide(approval, people.alice)
    assert after_one.status == ApprovalStatus.PENDING
    assert not after_one.token
    assert AuditEvent.objects.filter(type="approval.decision_recorded").count() == 1
    assert drive.resume(run).status == "awaiting_approval"
    assert target.count(path) == 0
    assert _refused(drive, approval, people.alice).code == "CONFLICT"  # the same approver twice

    after_two = drive.decide(approval, people.bob)
    assert after_two.status == ApprovalStatus.APPROVED
    run = drive.resume(run)
    assert run.status == "succeeded"
    assert target.count(path) == 1
    assert AuditEvent.objects.get(type="approval.approved").payload["approvers"] == ["alice", "bob"]


def test_quorum_one_deny_ends_it(drive, people, target, path_for):
    path = path_for("quorum-deny")
    run = drive.start(
        drive.automation(
            definition(risk_step("medium", target.url(path)) | {"approvals_required": 2}, autonomy="A2")
        )
    )
    approval = drive.approval(run)

    drive.decide(approval, people.alice)
    denied = drive.decide(approval, people.bob, "deny", reason="no")

    assert denied.status == ApprovalStatus.DENIED
    assert _refused(drive, approval, people.carol).code == "CONFLICT"
    run = drive.resume(run)
    assert run.status == "failed"
    assert run.error["code"] == "APPROVAL_DENIED"
    assert target.count(path) == 0


def test_require_approval_step_can_ask_for_a_quorum(drive, people):
    step = {
        "step_id": "sign_off",
        "action": "require_approval",
        "config": {"message": "ok?", "approvals_required": 3},
    }
    run = drive.start(drive.automation(definition(step, autonomy="A4")))

    assert drive.approval(run).approvals_required == 3


@pytest.fixture
def four_eyes(people):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)


def test_four_eyes_the_triggering_user_cannot_approve(drive, people, target, path_for, four_eyes):
    path = path_for("four-eyes")
    # Owen administers the workspace (may approve in general) and starts the run himself.
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")), user=people.owner
    )
    approval = drive.approval(run)
    assert approval.requested_by == "user:owner"

    error = _refused(drive, approval, people.owner)
    assert (error.code, error.http_status) == ("PERMISSION_DENIED", 403)
    assert "four-eyes" in error.message

    drive.decide(approval, people.alice)
    assert drive.resume(run).status == "succeeded"
    assert target.count(path) == 1


def test_four_eyes_the_last_editor_cannot_approve(drive, people, target, path_for, four_eyes):
    from automations.services import automation_update

    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("editor"))), autonomy="A2"), user=people.owner
    )
    automation = automation_update(automation=automation, user=people.alice,
                                   definition={**automation.definition, "goal": "edited by alice"})  # fmt: skip
    run = drive.start(automation, user=people.operator)

    error = _refused(drive, drive.approval(run), people.alice)

    assert (error.code, error.http_status) == ("PERMISSION_DENIED", 403)
    assert drive.decide(drive.approval(run), people.bob).status == ApprovalStatus.APPROVED


def test_without_four_eyes_the_triggering_approver_may_approve(drive, people, target, path_for):
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("self"))), autonomy="A2")),
        user=people.owner,
    )

    assert drive.decide(drive.approval(run), people.owner).status == ApprovalStatus.APPROVED


def test_expiry_sweep_expires_resumes_and_the_step_fails_approval_expired(drive, target, parked, sent,
                                                                         django_capture_on_commit_callbacks):  # fmt: skip
    Approval.objects.filter(pk=parked.approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    with django_capture_on_commit_callbacks(execute=True):
        result = approvals_expire()

    assert result["expired"] == 1
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.EXPIRED
    assert ("autoplane.resume_run", [str(parked.run.pk), "approval expired"]) in sent
    run = drive.resume(parked.run)
    assert run.status == "failed"
    assert run.error["code"] == "APPROVAL_EXPIRED"
    assert drive.step(run, "cleanup", phase="on_failure").status == "succeeded"
    assert target.count(parked.path) == 0
    assert "approval.expired" in audit_types(run.trace_id)
    assert Approval.objects.get(pk=parked.approval.pk).settled_at is not None


def test_expiry_sweep_leaves_live_approvals_alone(drive, parked):
    assert approvals_expire() == {"expired": 0, "nudged": 0}
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


def test_a_pending_approval_past_its_expiry_cannot_be_approved(drive, people, parked):
    Approval.objects.filter(pk=parked.approval.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    assert _refused(drive, parked.approval, people.alice).code == "CONFLICT"


def test_sweep_resends_resume_for_a_decision_the_run_missed(drive, people, parked, sent,
                                                            django_capture_on_commit_callbacks):  # fmt: skip
    """The decision landed before the run finished parking (or the message was lost)."""
    drive.decide(parked.approval, people.alice)
    Approval.objects.filter(pk=parked.approval.pk).update(decided_at=timezone.now() - timedelta(minutes=1))

    with django_capture_on_commit_callbacks(execute=True):
        assert approvals_expire()["nudged"] == 1

    assert ("autoplane.resume_run", [str(parked.run.pk), "approval decided (resent)"]) in sent
    drive.resume(parked.run)
    assert approvals_expire()["nudged"] == 0  # consumed: settled


def test_the_expire_task_is_registered_under_its_beat_name():
    from approvals import tasks

    assert tasks.expire_approvals.name == "autoplane.expire_approvals"


# --- one-click links ---------------------------------------------------------------------


def _open(browser: Client, url: str):
    """What the link page's script does: POST the fragment's token to the page (step=review)."""
    path, _, token = url.partition("#")
    page = browser.get(path)
    assert page.status_code == 200
    assert 'id="open"' in page.content.decode()
    csrf = page.cookies["csrftoken"].value
    return (
        path,
        token,
        csrf,
        browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": "review"}),
    )


def test_one_click_link_keeps_the_token_out_of_path_and_query(people, parked):
    url = approval_link_create(approval=parked.approval, user=people.alice)

    path, _, token = url.partition("#")
    assert path == "/api/v1/approvals/link/"
    assert "?" not in url
    assert len(token) > 40  # the signed token is only in the fragment, which browsers never send


def test_one_click_link_shows_the_payload_and_approves_once(drive, people, target, parked):
    url = approval_link_create(approval=parked.approval, user=people.alice)
    browser = Client(enforce_csrf_checks=True)

    path, token, csrf, page = _open(browser, url)
    assert page.status_code == 200
    body = page.content.decode()
    assert target.url(parked.path) in body
    assert "create_item" in body
    assert 'id="confirm"' in body
    assert (
        Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING
    )  # reviewing decides nothing

    confirmed = browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": "approve"})
    assert confirmed.status_code == 200
    assert 'id="done"' in confirmed.content.decode()
    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decisions.get().via == "link"
    assert approval.decisions.get().user == people.alice

    again = browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": "approve"})
    assert again.status_code == 409
    assert ConsumedNonce.objects.filter(nonce__startswith="link:").count() == 1
    assert drive.resume(parked.run).status == "succeeded"
    assert target.count(parked.path) == 1


def test_one_click_link_post_without_csrf_token_is_refused(people, parked):
    path, _, token = approval_link_create(approval=parked.approval, user=people.alice).partition("#")

    response = Client(enforce_csrf_checks=True).post(path, {"token": token, "step": "approve"})

    assert response.status_code == 403
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


def test_tampered_or_expired_link_is_refused(people, parked, monkeypatch):
    path, _, token = approval_link_create(approval=parked.approval, user=people.alice).partition("#")
    assert Client().post(path, {"token": token[:-3] + "abc", "step": "review"}).status_code == 400
    assert Client().post(path, {"step": "approve"}).status_code == 400

    from approvals import services

    later = timezone.now() + timedelta(days=2)
    monkeypatch.setattr(services, "timezone", SimpleNamespace(now=lambda: later))
    assert Client().post(path, {"token": token, "step": "review"}).status_code == 400


def test_one_click_link_respects_four_eyes(drive, people, target, path_for, four_eyes):
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("link"))), autonomy="A2")),
        user=people.owner,
    )
    url = approval_link_create(approval=drive.approval(run), user=people.owner)
    browser = Client(enforce_csrf_checks=True)
    path, token, csrf, _ = _open(browser, url)

    response = browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": "approve"})

    assert response.status_code == 403
    assert drive.approval(run).status == ApprovalStatus.PENDING
    assert not ConsumedNonce.objects.exists()  # a refused decision does not use the link up


def test_only_approvers_get_links(people, parked):
    with pytest.raises(ApprovalError):
        approval_link_create(approval=parked.approval, user=people.operator)


def test_run_cancelled_while_awaiting_is_not_resumed(drive, people, parked):
    from approvals.services import ApprovalError
    from automations.services import run_cancel

    run_cancel(run=parked.run, user=people.owner)
    parked.approval.refresh_from_db()
    assert parked.approval.status == "invalidated"  # cancelling closes the open approval
    step = parked.run.steps.get()
    assert (step.status, step.error_code) == ("cancelled", "CANCELLED")
    assert step.error_message == "cancelled while waiting for a decision"
    with pytest.raises(ApprovalError):
        drive.decide(parked.approval, people.alice)

    run = drive.resume(parked.run)

    assert run.status == "cancelled"
    assert Run.objects.get(pk=run.pk).status == "cancelled"
