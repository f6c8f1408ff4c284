"""The approvals list defaults to Pending and shows what will run; Approve / Deny are offered only to
those the service would let decide (role, four-eyes, not already decided)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from approvals import services
from approvals.models import Approval, ApprovalStatus
from tests.factories import definition, risk_step
from workspaces.models import Workspace

LIST = reverse("admin:approvals_approval_changelist")


def _staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(AuthPermission.objects.get(codename="view_approval"))
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def parked(drive, target, path_for):
    path = path_for("console")
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")))
    return SimpleNamespace(run=run, url=target.url(path), approval=drive.approval(run))


def test_the_list_defaults_to_pending_and_all_is_one_click_away(people, parked):
    decided = Approval.objects.get(pk=parked.approval.pk)
    Approval.objects.filter(pk=decided.pk).update(status=ApprovalStatus.DENIED)
    pending = Approval.objects.create(**{
        f.attname: getattr(decided, f.attname) for f in Approval._meta.fields if f.attname not in ("id", "status")
    } | {"step_key": "plan:9:other", "step_id": "other"})  # fmt: skip
    admin = _staff(people.alice)

    default = admin.get(LIST).content.decode()
    everything = admin.get(LIST + "?status__exact=all").content.decode()

    assert reverse("admin:approvals_approval_change", args=[pending.pk]) in default
    assert reverse("admin:approvals_approval_change", args=[decided.pk]) not in default
    assert '<li class="selected">\n    <a href="?status__exact=pending"' in default
    assert reverse("admin:approvals_approval_change", args=[decided.pk]) in everything


def test_the_list_shows_what_will_run(people, parked):
    body = _staff(people.alice).get(LIST).content.decode()

    assert "http_request: {" in body
    assert parked.url in body


def test_approve_is_not_offered_to_someone_who_already_approved(people, parked):
    Approval.objects.filter(pk=parked.approval.pk).update(approvals_required=2)
    alice = _staff(people.alice)
    page = reverse("admin:approvals_approval_change", args=[parked.approval.pk])
    assert 'id="approve-button"' in alice.get(page).content.decode()

    services.approval_decide(
        approval_id=parked.approval.pk, user=people.alice, decision="approve", via="admin"
    )

    body = alice.get(page).content.decode()
    assert 'id="approve-button"' not in body
    assert "you have already decided on this approval" in body
    assert 'id="approve-button"' in _staff(people.bob).get(page).content.decode()


def test_approve_is_not_offered_to_whom_four_eyes_excludes(people, parked):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    owner = people.owner  # an admin may approve, but he last edited the automation
    page = reverse("admin:approvals_approval_change", args=[parked.approval.pk])

    body = _staff(owner).get(page).content.decode()

    assert 'id="approve-button"' not in body
    assert "four-eyes" in body


def test_a_viewer_is_told_why_there_is_no_approve_button(people, parked):
    body = (
        _staff(people.viewer)
        .get(reverse("admin:approvals_approval_change", args=[parked.approval.pk]))
        .content
    )
    assert 'id="approve-button"' not in body.decode()
    assert "does not allow approving" in body.decode()
