"""In a real browser: an approver logs into the admin, sees the pending step's payload, approves,
and the run — executed and resumed by a real Celery worker — completes.

Headless Debian Chromium (never a downloaded browser). The worker is started with
this test's signing key, so a token minted in the web process verifies in the worker.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission as AuthPermission

from config.celery import QUEUES
from tests import live
from tests.factories import definition, risk_step

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.workers,
    pytest.mark.skipif(
        not CHROMIUM.exists() and shutil.which("chromium") is None,
        reason="Debian chromium is not installed (apt-get install -y chromium)",
    ),
]


@pytest.fixture
def sent() -> None:
    """Here messages really go to the broker (overrides the capturing fixture)."""


def test_approver_approves_in_the_admin_and_the_run_completes(
    people, drive, target, path_for, live_server, worker_factory, signing_key_file, monkeypatch
):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop on this thread; the ORM calls here are plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    worker = worker_factory(
        QUEUES, concurrency=1, env=live.live_worker_env(AUTOPLANE_SIGNING_KEY_FILE=str(signing_key_file))
    )
    approver = people.alice
    approver.is_staff = True
    approver.save(update_fields=["is_staff"])
    approver.user_permissions.add(AuthPermission.objects.get(codename="view_approval"))
    path = path_for("browser")
    automation = drive.automation(
        definition(risk_step("medium", target.url(path)), name="nightly-cleanup", autonomy="A2")
    )

    from automations.services import run_create

    run = run_create(automation=automation, inputs={}, user=people.operator).run
    parked = live.wait_for_run(run.pk, {"awaiting_approval", "failed", "succeeded"})
    assert parked.status == "awaiting_approval", (parked.error, worker.log_tail())
    approval = drive.approval(parked)
    assert target.count(path) == 0

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(f"{live_server.url}/admin/login/?next=/admin/approvals/approval/")
            page.fill("#id_username", "alice")
            page.fill("#id_password", "pw-alice")
            page.click("input[type=submit]")
            page.wait_for_url("**/admin/approvals/approval/")
            assert "Approvals — 1 pending" in page.content()

            page.click(f"a[href$='/admin/approvals/approval/{approval.pk}/change/']")
            payload = page.inner_text("#approval-what")
            assert target.url(path) in payload
            assert '"method": "POST"' in payload

            page.click("#approve-button")
            page.wait_for_selector(".messagelist .success")
            assert "now approved" in page.inner_text(".messagelist")
            assert page.query_selector("#approve-button") is None
        finally:
            browser.close()

    done = live.wait_for_run(run.pk, {"succeeded", "failed", "needs_attention"})
    assert done.status == "succeeded", (done.error, worker.log_tail())
    assert target.count(path) == 1
    approval.refresh_from_db()
    assert approval.status == "consumed"
    assert approval.decisions.get().via == "admin"
