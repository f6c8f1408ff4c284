"""The approvals admin: pending count, payload shown, approve/deny buttons and actions — all via approval_decide."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.gate import standing_signature_valid
from approvals.models import Approval, ApprovalStatus, StandingApproval
from tests.factories import definition, risk_step
from workspaces.models import Workspace


def _staff(user, *perms: str):
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(
        *AuthPermission.objects.filter(content_type__app_label="approvals", codename__in=perms)
    )
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def parked(drive, target, path_for):
    path = path_for("admin")
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")))
    return SimpleNamespace(run=run, path=path, approval=drive.approval(run))


@pytest.fixture
def alice(people):
    return _staff(people.alice, "view_approval", "view_standingapproval", "add_standingapproval",
                  "change_standingapproval")  # fmt: skip


def test_changelist_shows_the_pending_count(alice, parked):
    response = alice.get(reverse("admin:approvals_approval_changelist"))

    assert response.status_code == 200
    body = response.content.decode()
    assert "Approvals — 1 pending" in body
    assert "create_item" in body
    assert "user:operator" in body


def test_changelist_is_scoped_to_the_users_workspaces(people, parked):
    outsider = _staff(people.outsider, "view_approval")

    response = outsider.get(reverse("admin:approvals_approval_changelist"))

    assert "Approvals — 0 pending" in response.content.decode()
    assert (
        outsider.get(reverse("admin:approvals_approval_change", args=[parked.approval.pk])).status_code == 302
    )


def test_detail_shows_the_payload_pretty_printed_and_the_buttons(alice, target, parked):
    response = alice.get(reverse("admin:approvals_approval_change", args=[parked.approval.pk]))

    body = response.content.decode()
    assert response.status_code == 200
    assert 'id="approval-what"' in body
    assert "&quot;url&quot;: &quot;" + target.url(parked.path) in body
    assert 'id="approve-button"' in body
    assert 'id="deny-button"' in body


def test_approve_button_approves_and_the_run_completes(drive, alice, target, parked):
    response = alice.post(reverse("admin:approvals_approval_approve", args=[parked.approval.pk]))

    assert response.status_code == 302
    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decisions.get().via == "admin"
    assert drive.resume(parked.run).status == "succeeded"
    assert target.count(parked.path) == 1
    page = alice.get(reverse("admin:approvals_approval_change", args=[parked.approval.pk])).content.decode()
    assert 'id="approve-button"' not in page


def test_approve_button_needs_post(alice, parked):
    response = alice.get(reverse("admin:approvals_approval_approve", args=[parked.approval.pk]))

    assert response.status_code == 405
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


def test_deny_button_requires_a_reason(alice, parked):
    url = reverse("admin:approvals_approval_deny", args=[parked.approval.pk])
    assert 'name="reason"' in alice.get(url).content.decode()

    empty = alice.post(url, {"reason": "  "})
    assert empty.status_code == 200
    assert "This field is required" in empty.content.decode()
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING

    assert alice.post(url, {"reason": "wrong host"}).status_code == 302
    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.status == ApprovalStatus.DENIED
    assert approval.decisions.get().reason == "wrong host"


def test_list_actions_approve_and_deny_with_an_intermediate_reason_form(
    drive, alice, target, path_for, parked
):
    other = drive.start(
        drive.automation(
            definition(risk_step("medium", target.url(path_for("admin-2"))), name="b", autonomy="A2")
        )
    )
    other_approval = drive.approval(other)
    changelist = reverse("admin:approvals_approval_changelist")

    alice.post(changelist, {"action": "approve_selected", "_selected_action": [str(parked.approval.pk)]})
    asked = alice.post(changelist, {"action": "deny_selected", "_selected_action": [str(other_approval.pk)]})
    assert asked.status_code == 200
    assert 'name="reason"' in asked.content.decode()
    assert Approval.objects.get(pk=other_approval.pk).status == ApprovalStatus.PENDING
    no_reason = alice.post(changelist, {"action": "deny_selected", "_selected_action": [str(other_approval.pk)],
                                        "apply": "1", "reason": ""})  # fmt: skip
    assert no_reason.status_code == 200
    assert Approval.objects.get(pk=other_approval.pk).status == ApprovalStatus.PENDING
    alice.post(changelist, {"action": "deny_selected", "_selected_action": [str(other_approval.pk)], "apply": "1",
                            "reason": "duplicate"})  # fmt: skip

    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.APPROVED
    assert Approval.objects.get(pk=other_approval.pk).status == ApprovalStatus.DENIED


def test_admin_enforces_four_eyes_and_roles(drive, people, target, path_for):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path_for("admin-4e"))), autonomy="A2")),
                      user=people.owner)  # fmt: skip
    approval = drive.approval(run)
    owner = _staff(people.owner, "view_approval")
    viewer = _staff(people.viewer, "view_approval")

    refused = owner.post(reverse("admin:approvals_approval_approve", args=[approval.pk]), follow=True)
    viewer.post(reverse("admin:approvals_approval_approve", args=[approval.pk]))

    assert "four-eyes" in refused.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_standing_approval_admin_creates_a_signed_row(drive, people, alice, target, path_for):
    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("admin-standing"))), autonomy="A2")
    )
    expires = timezone.now() + timedelta(days=1)

    response = alice.post(reverse("admin:approvals_standingapproval_add"), {
        "workspace": people.workspace.pk, "automation_id": str(automation.pk), "capability_id": "http_request",
        "max_uses": 5, "expires_at_0": expires.strftime("%Y-%m-%d"), "expires_at_1": expires.strftime("%H:%M:%S"),
        "arg_constraint": "", "reason": "batch",
    })  # fmt: skip

    assert response.status_code == 302, response.content.decode()[:3000]
    standing = StandingApproval.objects.get()
    assert standing.created_by == people.alice
    assert standing_signature_valid(standing)
    assert drive.start(automation).status == "succeeded"


def test_standing_approval_admin_refuses_invalid_bounds(people, alice, drive, target, path_for):
    automation = drive.automation(
        definition(risk_step("medium", target.url(path_for("admin-standing-bad"))), autonomy="A2")
    )
    expires = timezone.now() + timedelta(days=1)

    response = alice.post(reverse("admin:approvals_standingapproval_add"), {
        "workspace": people.workspace.pk, "automation_id": str(automation.pk), "capability_id": "http_request",
        "max_uses": 5, "expires_at_0": expires.strftime("%Y-%m-%d"), "expires_at_1": expires.strftime("%H:%M:%S"),
        "arg_constraint": '{"type": 5}', "reason": "",
    })  # fmt: skip

    assert response.status_code == 200
    assert "not a valid JSON Schema" in response.content.decode()
    assert not StandingApproval.objects.exists()
