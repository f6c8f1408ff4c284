"""Approval notices, delivered for real: e-mail through a local SMTP server, webhooks to a local
receiver (signatures checked with ``standardwebhooks``), and the hostile cases around them."""

from __future__ import annotations

import json
import re
import time
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from standardwebhooks import Webhook

from approvals.models import Approval, ApprovalStatus
from audit.models import AuditEvent
from notifications import services
from notifications.models import FAILING_AFTER, Channel, Delivery, DeliveryStatus
from tests.factories import definition, member, risk_step
from workspaces.models import Role, Workspace
from workspaces.services import membership_set_role

User = get_user_model()


@pytest.fixture
def emails(people):
    for name in ("alice", "bob", "carol", "owner", "operator", "viewer"):
        User.objects.filter(username=name).update(email=f"{name}@acme.example")


def _email_channel(people, to=("role:approver",)) -> Channel:
    return services.channel_create(workspace=people.workspace, user=people.owner, kind="email", name="mail",
                                   to=list(to))[0]  # fmt: skip


def _webhook_channel(people, url: str) -> tuple[Channel, str]:
    channel, secret = services.channel_create(workspace=people.workspace, user=people.owner, kind="webhook",
                                              name="hook", url=url)  # fmt: skip
    assert secret is not None
    return channel, secret


@pytest.fixture
def park(drive, target, path_for, django_capture_on_commit_callbacks):
    """Start a run whose medium-risk step waits for approval (the gate's after-commit work runs)."""

    def start(**step_extra):
        path = path_for("notify")
        step = {**risk_step("medium", target.url(path)), **step_extra}
        with django_capture_on_commit_callbacks(execute=True):
            run = drive.start(drive.automation(definition(step, autonomy="A2", name="deploy")))
        assert run.status == "awaiting_approval"
        return SimpleNamespace(run=run, path=path, approval=drive.approval(run))

    return start


def _link(message) -> str:
    body = message.get_payload(decode=True).decode()
    return re.search(r"https://autoplane\.example/\S+", body.split("Review and approve")[1]).group(0)


def _click(link: str, step: str = "approve"):
    """What a browser does with the e-mailed link: GET the page, its script POSTs the fragment's token."""
    assert link.startswith("https://autoplane.example/api/v1/approvals/link/#")
    path, _, token = link.removeprefix("https://autoplane.example").partition("#")
    browser = Client(enforce_csrf_checks=True)
    csrf = browser.get(path).cookies["csrftoken"].value
    review = browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": "review"})
    if review.status_code != 200:
        return review
    return browser.post(path, {"csrfmiddlewaretoken": csrf, "token": token, "step": step})


def test_every_eligible_approver_is_emailed_and_the_webhook_is_signed(
    people, emails, smtp, receiver, queued, park
):
    _email_channel(people)
    _, secret = _webhook_channel(people, receiver.url("/approvals"))

    parked = park()

    assert len(queued.deliveries()) == 4  # alice, bob, carol by e-mail; one webhook post
    results = queued.deliver_all()
    assert sorted(results.values()) == ["delivered"] * 4
    assert sorted(to for _, (to,) in smtp.envelopes) == [
        "alice@acme.example",
        "bob@acme.example",
        "carol@acme.example",
    ]
    message = smtp.messages[0]
    body = message.get_payload(decode=True).decode()
    assert "deploy" in message["Subject"]
    assert "create_item" in message["Subject"]
    assert "medium" in body
    assert parked.approval.why in body
    assert target_url(parked) in body
    assert parked.approval.expires_at.isoformat() in body
    link = _link(message)
    assert "?" not in link
    assert link.split("#")[0].endswith("/approvals/link/")

    ((method, headers, raw),) = receiver.requests("/approvals")
    assert method == "POST"
    payload = Webhook(secret).verify(raw, {k.lower(): v for k, v in headers.items()})
    assert payload["type"] == "approval.requested"
    data = payload["data"]
    assert (data["approval_id"], data["step"], data["risk"]) == (
        str(parked.approval.pk),
        "create_item",
        "medium",
    )
    assert data["what"] == parked.approval.what
    assert (
        data["approval_url"]
        == f"https://autoplane.example/admin/approvals/approval/{parked.approval.pk}/change/"
    )
    with pytest.raises(Exception):  # noqa: B017, PT011 - any verification failure
        Webhook(services.new_webhook_secret()).verify(raw, {k.lower(): v for k, v in headers.items()})
    assert AuditEvent.objects.filter(type="notification.delivered").count() == 4


def target_url(parked) -> str:
    return parked.approval.what["url"]


def test_the_emailed_link_approves_once_and_the_run_goes_on(
    drive, people, emails, smtp, queued, park, target
):
    _email_channel(people)
    parked = park()
    queued.deliver_all()
    link = next(_link(m) for m in smtp.messages if m["To"] == "alice@acme.example")

    response = _click(link)

    assert response.status_code == 200
    assert 'id="done"' in response.content.decode()
    approval = Approval.objects.get(pk=parked.approval.pk)
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decisions.get().user == people.alice
    again = _click(link)
    assert again.status_code == 409  # a link used twice
    assert drive.resume(parked.run).status == "succeeded"
    assert target.count(parked.path) == 1


def test_an_approver_removed_between_notice_and_click_cannot_decide(people, emails, smtp, queued, park):
    _email_channel(people)
    parked = park()
    queued.deliver_all()
    link = next(_link(m) for m in smtp.messages if m["To"] == "bob@acme.example")

    membership_set_role(workspace=people.workspace, user=people.bob, role=Role.VIEWER)
    response = _click(link)

    assert response.status_code == 403
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


def test_an_approver_removed_before_the_send_is_not_told(people, emails, smtp, queued, park):
    _email_channel(people)
    park()
    membership_set_role(workspace=people.workspace, user=people.carol, role=Role.VIEWER)

    results = queued.deliver_all()

    assert sorted(results.values()) == ["delivered", "delivered", "skipped"]
    assert "carol@acme.example" not in [to for _, (to,) in smtp.envelopes]


def test_four_eyes_leaves_out_the_people_behind_the_run(people, emails, smtp, queued, park):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    member("dana", people.workspace, Role.ADMIN, email="dana@acme.example")
    _email_channel(people, to=["role:admin"])  # owner (who wrote the automation) and dana

    park()
    queued.deliver_all()

    assert [to for _, (to,) in smtp.envelopes] == ["dana@acme.example"]


def test_no_notice_after_a_decision(drive, people, emails, smtp, receiver, queued, park):
    _email_channel(people)
    _webhook_channel(people, receiver.url("/late"))
    parked = park()
    drive.decide(parked.approval, people.alice)

    results = queued.deliver_all()

    assert set(results.values()) == {"skipped"}
    assert smtp.messages == []
    assert receiver.requests("/late") == []


def test_the_step_notify_list_is_told_too(people, emails, smtp, queued, park):
    park(approval={"notify": ["oncall@acme.example", "bob"]})

    queued.deliver_all()

    assert sorted(to for _, (to,) in smtp.envelopes) == ["bob@acme.example", "oncall@acme.example"]
    oncall = next(m for m in smtp.messages if m["To"] == "oncall@acme.example")
    assert (
        "Review and approve" not in oncall.get_payload(decode=True).decode()
    )  # not a member: no link of theirs
    bob = next(m for m in smtp.messages if m["To"] == "bob@acme.example")
    assert "Review and approve" in bob.get_payload(decode=True).decode()


def test_a_failing_receiver_is_retried_and_never_holds_the_gate(
    drive, people, receiver, queued, park, target
):
    channel, _ = _webhook_channel(people, receiver.url("/flaky"))
    receiver.behave("/flaky", "fail_once")
    parked = park()  # the gate returned: the run is parked, the delivery only queued
    (delivery_id,) = queued.deliveries()

    assert services.delivery_attempt(delivery_id) == "retry"
    delivery = Delivery.objects.get(pk=delivery_id)
    assert (delivery.status, delivery.attempts) == (DeliveryStatus.PENDING, 1)
    assert "HTTP 500" in delivery.last_error
    assert services.delivery_attempt(delivery_id) == "delivered"
    assert Delivery.objects.get(pk=delivery_id).attempts == 2
    assert len(receiver.requests("/flaky")) == 2
    assert receiver.requests("/flaky")[0][1]["webhook-id"] == receiver.requests("/flaky")[1][1]["webhook-id"]
    types = list(AuditEvent.objects.filter(type__startswith="notification.d").values_list("type", flat=True))
    assert "notification.delivered" in types
    assert AuditEvent.objects.filter(type="notification.failed").count() == 1
    drive.decide(parked.approval, people.alice)
    assert drive.resume(parked.run).status == "succeeded"
    channel.refresh_from_db()
    assert channel.consecutive_failures == 0


def test_a_hanging_receiver_times_out_quickly_and_the_run_is_decided_meanwhile(
    drive, people, receiver, queued, park
):
    _webhook_channel(people, receiver.url("/hang"))
    receiver.behave("/hang", "hang")
    parked = park()
    (delivery_id,) = queued.deliveries()

    drive.decide(parked.approval, people.alice)  # nobody waits for the notice
    assert drive.resume(parked.run).status == "succeeded"
    Approval.objects.filter(pk=parked.approval.pk).update(status=ApprovalStatus.PENDING)  # pretend still open
    started = time.monotonic()
    assert services.delivery_attempt(delivery_id) == "retry"
    assert time.monotonic() - started < 3  # AUTOPLANE_NOTIFY_TIMEOUT_SECONDS = 0.5 here
    assert "Timeout" in Delivery.objects.get(pk=delivery_id).last_error


def test_a_channel_that_keeps_failing_is_marked_failing_on_the_admin_home(
    people, receiver, queued, park, client
):
    channel, _ = _webhook_channel(people, receiver.url("/down"))
    receiver.behave("/down", "fail")
    for _ in range(FAILING_AFTER):
        park()
    ids = queued.deliveries()
    assert len(ids) == FAILING_AFTER
    for delivery_id in ids:
        outcomes = [services.delivery_attempt(delivery_id) for _ in range(services.MAX_ATTEMPTS)]
        assert outcomes == ["retry"] * (services.MAX_ATTEMPTS - 1) + ["failed"]
        assert services.delivery_attempt(delivery_id) == "gone"  # out of attempts: nothing more is sent
    channel.refresh_from_db()
    assert channel.failing
    assert len(receiver.requests("/down")) == FAILING_AFTER * services.MAX_ATTEMPTS

    User.objects.filter(pk=people.owner.pk).update(is_staff=True)
    client.force_login(people.owner)
    home = client.get("/admin/").content.decode()
    assert 'id="failing-channels"' in home
    assert "hook" in home
    assert "HTTP 500" in home


def test_the_egress_guard_refuses_at_send_time_too(people, receiver, queued, park, settings):
    _webhook_channel(people, receiver.url("/guarded"))
    # After the channel was saved, loopback is closed again: the deployment no longer opens it.
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []
    Workspace.objects.filter(pk=people.workspace.pk).update(egress_allowlist=[])
    park()
    (delivery_id,) = queued.deliveries()

    assert services.delivery_attempt(delivery_id) == "failed"  # refused outright, not retried
    delivery = Delivery.objects.get(pk=delivery_id)
    assert delivery.attempts == 1
    assert "egress deny-list" in delivery.last_error
    assert receiver.requests("/guarded") == []


def test_slack_gets_block_kit_with_a_button_to_the_approval(people, receiver, queued, park):
    services.channel_create(workspace=people.workspace, user=people.owner, kind="slack", name="slack",
                            url=receiver.url("/slack"))  # fmt: skip
    parked = park()
    queued.deliver_all()

    ((_, _, raw),) = receiver.requests("/slack")
    message = json.loads(raw)
    assert "create_item" in message["text"]
    (actions,) = [b for b in message["blocks"] if b["type"] == "actions"]
    assert actions["elements"][0]["url"].endswith(f"/admin/approvals/approval/{parked.approval.pk}/change/")


def test_an_smtp_server_that_is_down_is_retried(people, emails, smtp, queued, park):
    _email_channel(people, to=["alice@acme.example"])
    park()
    smtp.stop()

    (delivery_id,) = queued.deliveries()
    assert services.delivery_attempt(delivery_id) == "retry"
    assert Delivery.objects.get(pk=delivery_id).last_error


def test_a_broken_channel_never_fails_the_gate(people, emails, queued, park, monkeypatch):
    _email_channel(people)

    def broken(*args, **kwargs):
        raise RuntimeError("resolver bug")

    monkeypatch.setattr(services, "resolve_targets", broken)
    parked = park()  # asserts the run parked

    assert parked.approval.status == ApprovalStatus.PENDING
    assert queued.deliveries() == []
