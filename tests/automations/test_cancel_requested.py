"""A cancel that cannot interrupt the running step is shown as "cancel requested" until the step returns.

``send_email`` is declared ``interruptible=False`` (a message half handed to a mail
server may or may not go out). The step talks to a real SMTP conversation on a local
socket that holds its greeting until the test lets it go; the executor runs in a
thread of the test, on committed data, as a worker would.
"""

from __future__ import annotations

import socketserver
import threading
import time
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations import services
from automations.executor import execute_run
from automations.models import Run, RunStatus, StepRun
from capabilities import registry
from tests.factories import client_for, definition

pytestmark = pytest.mark.django_db(transaction=True)


class _HeldSmtp(socketserver.StreamRequestHandler):
    """A minimal SMTP server whose greeting waits for ``server.release``."""

    def handle(self):
        self.server.connected.set()
        self.server.release.wait(60)
        self.wfile.write(b"220 held ESMTP\r\n")
        while line := self.rfile.readline():
            verb = line[:4].upper()
            if verb == b"DATA":
                self.wfile.write(b"354 go ahead\r\n")
                while self.rfile.readline() not in (b".\r\n", b""):
                    pass
                self.server.delivered += 1
                self.wfile.write(b"250 queued\r\n")
            elif verb == b"QUIT":
                self.wfile.write(b"221 bye\r\n")
                return
            else:
                self.wfile.write(b"250 ok\r\n")


@pytest.fixture
def held_smtp(settings) -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _HeldSmtp)
    server.daemon_threads = True
    server.connected, server.release, server.delivered = threading.Event(), threading.Event(), 0
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.server_address[1]
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


@pytest.fixture
def no_publish(monkeypatch):
    """The test's thread is the only executor: no execute_run message goes to a broker."""
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)


def _in_thread(run_id) -> threading.Thread:
    def work():
        try:
            execute_run(str(run_id))
        finally:
            connection.close()

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_send_email_declares_it_cannot_be_interrupted():
    assert registry.get_action("send_email").interruptible is False
    assert registry.get_action("run_python").interruptible is True
    assert registry.get_action("http_request").interruptible is True


def test_a_step_that_cannot_be_interrupted_shows_cancel_requested_until_it_returns(
    workspace, operator, held_smtp, no_publish
):
    automation = services.automation_create(workspace=workspace, definition=definition(
        {"step_id": "notify", "action": "send_email", "timeout_seconds": 60,
         "config": {"to": ["ops@example.com"], "subject": "deploy", "body": "done"}},
        {"step_id": "after", "action": "transform_data", "config": {"output": "never"}},
    ))  # fmt: skip
    run = services.run_create(automation=automation, inputs={}).run
    executor = _in_thread(run.pk)
    assert held_smtp.connected.wait(20), "the step never reached the mail server"
    api = client_for(operator)

    cancelled = api.post(f"/api/v1/runs/{run.pk}/cancel")

    assert cancelled.status_code == 200, cancelled.content
    assert (cancelled.json()["status"], cancelled.json()["cancel_requested"]) == ("running", True)
    # however long the hand-over takes, the run says a cancel is pending and the step still runs
    time.sleep(1.5)  # three cancel polls of an interruptible step: this one is not interrupted
    shown = api.get(f"/api/v1/runs/{run.pk}").json()
    assert (shown["status"], shown["cancel_requested"]) == ("running", True)
    assert [s["status"] for s in shown["steps"]] == ["running", "pending"]
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", password="pw-root"))
    page = admin.get(reverse("admin:automations_run_change", args=[run.pk])).content.decode()
    assert "(cancel requested)" in page

    held_smtp.release.set()
    executor.join(20)

    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert held_smtp.delivered == 1  # the hand-over finished: the email went out
    steps = dict(StepRun.objects.filter(run=run).values_list("step_id", "status"))
    assert steps == {"notify": "succeeded", "after": "skipped"}
    assert AuditEvent.objects.filter(trace_id=run.trace_id, type="step.cancelled").count() == 0
    assert (
        "(cancel requested)"
        not in admin.get(reverse("admin:automations_run_change", args=[run.pk])).content.decode()
    )
    assert Run.objects.get(pk=run.pk).cancel_requested
