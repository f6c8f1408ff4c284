"""Notices delivered by a real Celery worker on the default queue: e-mail to the local SMTP server,
a signed webhook to the local receiver, within a second of the gate."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from standardwebhooks import Webhook

from notifications import services
from notifications.models import Delivery, DeliveryStatus
from tests.factories import definition, risk_step
from tests.live import live_worker_env, wait_for

pytestmark = [pytest.mark.workers]

User = get_user_model()


def test_a_worker_delivers_the_first_notice(people, drive, target, path_for, receiver, smtp, worker_factory):
    User.objects.filter(username="alice").update(email="alice@acme.example")
    services.channel_create(workspace=people.workspace, user=people.owner, kind="email", name="mail",
                            to=["role:approver"])  # fmt: skip
    _, secret = services.channel_create(workspace=people.workspace, user=people.owner, kind="webhook",
                                        name="hook", url=receiver.url("/worker"))  # fmt: skip
    worker_factory(queues=["default"], env=live_worker_env(
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp.port), AUTOPLANE_PUBLIC_URL="https://autoplane.example",
    ))  # fmt: skip

    started = time.monotonic()
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("w"))), autonomy="A2"))
    )
    assert run.status == "awaiting_approval"

    wait_for(lambda: receiver.requests("/worker") and smtp.messages, timeout=30, what="both notices")
    elapsed = time.monotonic() - started
    ((_, headers, raw),) = receiver.requests("/worker")
    assert (
        Webhook(secret).verify(raw, {k.lower(): v for k, v in headers.items()})["type"]
        == "approval.requested"
    )
    assert [m["To"] for m in smtp.messages] == ["alice@acme.example"]
    assert (
        "https://autoplane.example/api/v1/approvals/link/#"
        in smtp.messages[0].get_payload(decode=True).decode()
    )
    wait_for(lambda: Delivery.objects.filter(status=DeliveryStatus.DELIVERED).count() == 2, what="recorded")
    assert elapsed < 30
