"""In a real browser, through the e-mailed link: a worker parks the run and e-mails the approver
(through the local SMTP server); Chromium opens the link, whose page POSTs the fragment's token,
shows what will run, and approves; the worker resumes the run to success.

Headless Debian Chromium (never a downloaded browser), as tests/approvals/test_browser.py.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from config.celery import QUEUES
from notifications import services
from tests import live
from tests.approvals.test_browser import CHROMIUM, CHROMIUM_ARGS, pytestmark  # noqa: F401
from tests.factories import definition, risk_step

User = get_user_model()


@pytest.fixture
def queued() -> None:
    """Here messages really go to the broker (overrides the capturing fixture)."""


def test_the_emailed_link_approves_in_a_browser(people, drive, target, path_for, live_server, smtp,
                                                worker_factory, signing_key_file, monkeypatch):  # fmt: skip
    from playwright.sync_api import sync_playwright

    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    User.objects.filter(username="alice").update(email="alice@acme.example")
    services.channel_create(workspace=people.workspace, user=people.owner, kind="email", name="mail",
                            to=["role:approver"])  # fmt: skip
    worker = worker_factory(QUEUES, concurrency=1, env=live.live_worker_env(
        AUTOPLANE_SIGNING_KEY_FILE=str(signing_key_file), AUTOPLANE_PUBLIC_URL=live_server.url,
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend", EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp.port),
    ))  # fmt: skip
    path = path_for("emailed")
    automation = drive.automation(
        definition(risk_step("medium", target.url(path)), name="rotate-keys", autonomy="A2")
    )

    from automations.services import run_create

    run = run_create(automation=automation, inputs={}, user=people.operator).run
    parked = live.wait_for_run(run.pk, {"awaiting_approval", "failed", "succeeded"})
    assert parked.status == "awaiting_approval", (parked.error, worker.log_tail())
    live.wait_for(lambda: smtp.messages, timeout=30, what="the notice e-mail")
    body = smtp.messages[0].get_payload(decode=True).decode()
    link = re.search(re.escape(live_server.url) + r"/api/v1/approvals/link/#\S+", body).group(0)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(link)
            page.wait_for_selector("#confirm")
            assert "#" not in page.url  # the script took the token out of the address bar
            assert target.url(path) in page.inner_text("#what")
            page.click("#confirm")
            page.wait_for_selector("#done")
        finally:
            browser.close()

    done = live.wait_for_run(run.pk, {"succeeded", "failed", "needs_attention"})
    assert done.status == "succeeded", (done.error, worker.log_tail())
    assert target.count(path) == 1
    approval = drive.approval(done)
    assert approval.decisions.get().via == "link"
    assert approval.decisions.get().user.username == "alice"
