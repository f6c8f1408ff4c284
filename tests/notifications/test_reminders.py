"""Reminders, escalation and the approval domain events: due on time, once per interval however
many sweeps run, never after a decision."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from approvals.services import approvals_expire
from automations.models import Automation, DomainEvent
from automations.services import automation_create
from config.errors import ServiceError
from notifications import services
from notifications.models import ApprovalWatch, Delivery, Notice
from tests.factories import definition, member, risk_step
from workspaces.models import Role

from .test_notices import _email_channel, _webhook_channel, emails, park  # noqa: F401

User = get_user_model()

PLAN = {"remind_after_seconds": 600, "remind_every_seconds": 1800, "escalate_after_seconds": 3600,
        "escalate_to": ["dana", "role:admin"]}  # fmt: skip


@pytest.fixture
def watched(people, emails, receiver, queued, park):  # noqa: F811
    member("dana", people.workspace, Role.OPERATOR, email="dana@acme.example")  # a manager, not an approver
    _email_channel(people, to=["alice@acme.example"])
    _webhook_channel(people, receiver.url("/remind"))
    parked = park(approval=PLAN)
    queued.deliver_all()
    return parked


@pytest.fixture
def sweep(django_capture_on_commit_callbacks):
    """The beat task's work at ``now``, its after-commit sends included."""

    def run(now):
        with django_capture_on_commit_callbacks(execute=True):
            return services.notifications_sweep(now=now)

    return run


def _at(parked, seconds: int):
    return parked.approval.created_at + timedelta(seconds=seconds)


def test_reminders_come_when_due_and_once_per_interval(people, watched, queued, smtp, receiver, sweep):
    assert sweep(_at(watched, 599))["reminded"] == 0
    assert sweep(_at(watched, 600))["reminded"] == 1
    # Another beat, or a second process, sweeping the same moment finds it claimed.
    assert sweep(_at(watched, 600))["reminded"] == 0
    assert sweep(_at(watched, 2399))["reminded"] == 0
    assert sweep(_at(watched, 2400))["reminded"] == 1

    reminders = Delivery.objects.filter(notice=Notice.REMINDER)
    assert sorted(reminders.values_list("sequence", flat=True)) == [1, 1, 2, 2]  # e-mail and webhook each
    assert sorted(queued.deliver_all().values()) == ["delivered"] * 4
    subjects = [m["Subject"] for m in smtp.messages]
    assert sum("Reminder" in s for s in subjects) == 2
    kinds = [r[2] for r in receiver.requests("/remind")]
    assert sum(b'"approval.reminded"' in body for body in kinds) == 2
    events = DomainEvent.objects.filter(event_type="approval.reminded")
    assert sorted(e.payload["reminder"] for e in events) == [1, 2]
    assert ApprovalWatch.objects.get().reminders_sent == 2


def test_a_stale_sweep_cannot_send_a_second_reminder(people, watched, sweep):
    stale = ApprovalWatch.objects.get()  # read by a slower process before the first one claims
    sweep(_at(watched, 600))

    claimed = ApprovalWatch.objects.filter(pk=stale.pk, reminders_sent=stale.reminders_sent).update(
        reminders_sent=stale.reminders_sent + 1
    )

    assert claimed == 0
    assert Delivery.objects.filter(notice=Notice.REMINDER).count() == 2


def test_escalation_tells_escalate_to_once(people, watched, queued, smtp, sweep):
    counts = sweep(_at(watched, 3600))
    again = sweep(_at(watched, 3700))

    assert counts["escalated"] == 1
    assert again["escalated"] == 0
    queued.deliver_all()
    escalated = sorted(m["To"] for m in smtp.messages if "Escalated" in m["Subject"])
    # dana by name; role:admin is the owner (four-eyes is off here); alice through the channel
    assert escalated == ["alice@acme.example", "dana@acme.example", "owner@acme.example"]
    dana = next(m for m in smtp.messages if m["To"] == "dana@acme.example")
    assert "Review and approve" not in dana.get_payload(decode=True).decode()  # she may not approve
    (event,) = DomainEvent.objects.filter(event_type="approval.escalated")
    assert event.payload["approval_id"] == str(watched.approval.pk)


def test_nothing_after_a_decision_and_the_decision_is_an_event(drive, people, watched, queued, sweep):
    drive.decide(watched.approval, people.alice)

    counts = sweep(_at(watched, 7200))

    assert counts == {"reminded": 0, "escalated": 0, "closed": 1, "resent": 0}
    assert not Delivery.objects.filter(notice__in=[Notice.REMINDER, Notice.ESCALATION]).exists()
    (event,) = DomainEvent.objects.filter(event_type="approval.decided")
    assert event.payload["decision"] == "approved"
    assert event.payload["decided_by"] == ["alice"]


def test_expiry_is_an_event(people, watched, sweep):
    approvals_expire(now=watched.approval.expires_at + timedelta(seconds=1))

    (event,) = DomainEvent.objects.filter(event_type="approval.expired")
    assert event.payload["step_id"] == "create_item"
    assert sweep(watched.approval.expires_at + timedelta(seconds=2))["closed"] == 1


def test_execution_approval_settings_apply_and_a_step_overrides_them(people, drive, target, path_for):
    step = {**risk_step("medium", target.url(path_for("x"))), "approval": {"remind_after_seconds": 120}}
    doc = definition(step, autonomy="A2", execution={"approval": {"remind_after_seconds": 900,
                                                                  "escalate_to": ["role:admin"]}})  # fmt: skip

    assert services.approval_settings(step, doc["execution"]) == {
        "remind_after_seconds": 120,
        "escalate_to": ["role:admin"],
    }


@pytest.mark.parametrize(
    ("approval", "path"),
    [
        ({"notify": ["not an address@"]}, "/plan/0/approval/notify/0"),
        ({"escalate_to": ["role:boss"]}, "/plan/0/approval/escalate_to/0"),
        ({"remind_every_seconds": 600}, "/plan/0/approval/remind_every_seconds"),
        ({"remind_after_seconds": 1}, "/plan/0/approval/remind_after_seconds"),
        ({"on_call": True}, "/plan/0/approval"),
    ],
)
def test_bad_notice_settings_are_refused_on_save(people, target, approval, path):
    step = {**risk_step("medium", target.url("/bad")), "approval": approval}

    with pytest.raises(ServiceError) as raised:
        automation_create(workspace=people.workspace, definition=definition(step), user=people.owner)

    assert raised.value.errors
    assert raised.value.errors[0]["path"].startswith(path)
    assert not Automation.objects.exists()


def test_a_lost_delivery_message_is_sent_again(people, watched, queued, sweep):
    # As if the worker had died holding the messages: pending, untouched for ten minutes.
    Delivery.objects.update(status="pending", attempts=0, updated_at=timezone.now() - timedelta(minutes=10))

    counts = sweep(_at(watched, 10))

    assert counts["resent"] == Delivery.objects.count()
    assert len(queued.deliveries()) == counts["resent"]


def test_on_expiry_re_request_asks_again_then_fails(drive, people, emails, queued, park, smtp,  # noqa: F811
                                                    django_capture_on_commit_callbacks):  # fmt: skip
    _email_channel(people, to=["alice@acme.example"])
    parked = park(approval={"on_expiry": "re_request", "max_re_requests": 1})
    queued.deliver_all()
    first = parked.approval

    approvals_expire(now=first.expires_at + timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        run = drive.resume(parked.run)

    assert run.status == "awaiting_approval"
    second = drive.approval(run)
    assert second.pk != first.pk
    assert second.status == "pending"
    assert second.plan_hash == first.plan_hash  # the same rendered step, hashed afresh
    first.refresh_from_db()
    assert first.status == "expired"
    assert queued.deliver_all()
    assert len(smtp.messages) == 2
    assert DomainEvent.objects.filter(event_type="approval.requested").count() == 2

    approvals_expire(now=second.expires_at + timedelta(seconds=1))
    run = drive.resume(run)
    assert run.status == "failed"
    assert drive.step(run, "create_item").error_code == "APPROVAL_EXPIRED"
