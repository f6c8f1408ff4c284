"""The operator console in a real browser (headless Debian Chromium through Playwright, as the
approvals journey does): Run with inputs on a real worker and watch it succeed, Cancel from the run
page, and the approvals list opening on Pending. Each page is screenshotted into the test's tmp dir.

Waits are explicit (for a selector, a URL, or the run's row in the database), never sleeps.
"""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.db import connections
from django.utils import timezone
from playwright.sync_api import sync_playwright

from approvals.models import Approval, ApprovalStatus
from automations import services
from automations.models import Run, RunStatus
from config.celery import QUEUES
from tests import live
from tests.factories import member
from workspaces.models import Role
from workspaces.services import workspace_get_or_create

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists() and shutil.which("chromium") is None,
        reason="Debian chromium is not installed (apt-get install -y chromium)",
    ),
]

GREETER = {
    "schema_version": "1.0", "name": "greeter",
    "inputs": {"schema": {"type": "object", "required": ["who"],
                          "properties": {"who": {"type": "string", "minLength": 2}}}},
    "plan": [{"step_id": "greet", "action": "transform_data", "config": {"output": {"hello": "{{ inputs.who }}"}}}],
}  # fmt: skip


@pytest.fixture
def operator_account(transactional_db):
    workspace = workspace_get_or_create(slug="acme")
    user = member("opal", workspace, Role.ADMIN, is_staff=True)  # admin: operates and approves
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label__in=["automations", "approvals"], codename__startswith="view_"))  # fmt: skip
    user.user_permissions.add(AuthPermission.objects.get(codename="change_automation"))
    return user


@pytest.fixture
def browser_page(live_server, operator_account, monkeypatch, tmp_path):
    """A logged-in page; ``page.shot(name)`` saves a screenshot under the test's tmp dir."""
    # Playwright's sync API keeps an event loop on this thread; the ORM calls here are plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(30_000)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "opal")
            page.fill("#id_password", "pw-opal")
            page.click("input[type=submit]")
            page.wait_for_selector("#needs-me")
            page.base = live_server.url
            page.shot = lambda name: page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
            yield page
        finally:
            # ORM calls made while Playwright's event loop runs get their own connection (Django keys
            # connections by async context there): close it, or the test database cannot be dropped.
            connections.close_all()
            browser.close()


@pytest.mark.workers
def test_run_with_inputs_from_the_automation_page_and_watch_it_succeed(
    browser_page, operator_account, worker_factory
):
    worker = worker_factory(QUEUES, concurrency=1, env=live.live_worker_env())
    page = browser_page
    automation = services.automation_create(
        workspace=operator_account.memberships.get().workspace, definition=GREETER, user=operator_account
    )
    page.goto(f"{page.base}/admin/automations/automation/{automation.pk}/change/")
    page.shot("automation")
    page.click("#run-button")
    page.wait_for_selector("#run-form")

    page.fill("#id_in_who", "A")  # the schema wants two characters at least: an inline error, no run
    page.click("#start-run")
    page.wait_for_selector("#run-form .errorlist")
    assert "too short" in page.inner_text("#run-form .errorlist")
    assert not Run.objects.exists()
    page.shot("run-form-error")

    page.fill("#id_in_who", "Ada")
    page.click("#start-run")
    page.wait_for_url("**/admin/automations/run/*/change/")
    assert "queued" in page.inner_text(".messagelist")
    run = Run.objects.get()
    done = live.wait_for_run(run.pk, {"succeeded", "failed", "needs_attention"})
    assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log_tail())

    page.reload()
    page.wait_for_selector("#step-timeline")
    page.shot("run-succeeded")
    assert "succeeded" in page.inner_text(".field-run_status")
    page.click("#step-timeline details summary")
    assert '"hello": "Ada"' in page.inner_text("#step-timeline")

    # The runs list fits a 1400 px window: a short id, no four-line UUID.
    Run.objects.create(workspace=run.workspace, automation=automation, automation_version=1, snapshot=run.snapshot,
                       status=RunStatus.FAILED, trace_id="t", queue=run.queue,
                       error={"code": "HTTP_ERROR", "message": "upstream answered 503 Service Unavailable " * 3})  # fmt: skip
    page.goto(f"{page.base}/admin/automations/run/")
    page.wait_for_selector("#result_list")
    page.shot("runs")
    assert page.evaluate("document.documentElement.scrollWidth") <= 1400
    assert page.evaluate("document.querySelector('#result_list').scrollWidth") <= page.evaluate(
        "document.querySelector('#changelist .results').clientWidth"
    )  # no horizontal scrolling inside the list either
    assert str(run.pk)[:8] in page.inner_text("#result_list")
    assert "HTTP_ERROR: upstream answered 503" in page.inner_text("#result_list")


def test_cancel_from_the_run_page(browser_page, operator_account):
    page = browser_page
    automation = services.automation_create(
        workspace=operator_account.memberships.get().workspace, definition=GREETER, user=operator_account
    )
    # Nobody consumes the queue here: the run stays queued until it is cancelled.
    run = services.run_create(automation=automation, inputs={"who": "Ada"}, user=operator_account).run
    page.goto(f"{page.base}/admin/automations/run/{run.pk}/change/")
    page.click("#cancel-button")
    page.wait_for_selector("#confirm-button")
    page.shot("cancel-confirm")

    page.click("#confirm-button")
    page.wait_for_selector(".messagelist .success")

    assert "cancel requested" in page.inner_text(".messagelist")
    assert "cancelled" in page.inner_text(".field-run_status")
    assert page.query_selector("#cancel-button") is None
    page.shot("cancelled")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


def test_the_approvals_list_opens_on_pending(browser_page, operator_account):
    page = browser_page
    workspace = operator_account.memberships.get().workspace
    base = {"workspace": workspace, "automation_id": "00000000-0000-0000-0000-000000000001", "step_id": "send",
            "action": "http_request", "capability_id": "http_request", "risk": "high", "plan_hash": "0" * 64,
            "trace_id": "t", "expires_at": timezone.now() + timedelta(hours=1)}  # fmt: skip
    Approval.objects.create(run_id="00000000-0000-0000-0000-00000000000a", automation_name="pay-invoices",
                            step_key="plan:0:send", what={"url": "https://pay.example/invoices"}, **base)  # fmt: skip
    Approval.objects.create(run_id="00000000-0000-0000-0000-00000000000b", automation_name="old-denied-one",
                            step_key="plan:0:send", what={"url": "https://x"}, status=ApprovalStatus.DENIED,
                            **base)  # fmt: skip

    page.goto(f"{page.base}/admin/approvals/approval/")
    page.wait_for_selector("#result_list")
    page.shot("approvals")

    rows = page.inner_text("#result_list")
    assert "pay-invoices" in rows
    assert "https://pay.example/invoices" in rows  # what will run
    assert "old-denied-one" not in rows
    assert page.inner_text("#changelist-filter li.selected >> nth=0").strip() == "Pending"
    page.click("#changelist-filter >> text=All")
    page.wait_for_url("**status__exact=all")
    assert "old-denied-one" in page.inner_text("#result_list")


def _type_into_the_editor(page, text: str) -> None:
    """As a user pastes: select all in the code editor, then insert the text."""
    page.click(".definition-editor .ace_content")
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)


def test_the_definition_editor_checks_the_schema_as_you_type_and_saves(browser_page, operator_account):
    page = browser_page
    automation = services.automation_create(
        workspace=operator_account.memberships.get().workspace, definition=GREETER, user=operator_account
    )
    page.goto(f"{page.base}/admin/automations/automation/{automation.pk}/change/")
    page.wait_for_selector(".definition-editor .jsoneditor")  # the editor, served offline from the app
    page.shot("definition-editor")
    assert not page.is_visible("#id_definition")  # the field is underneath, kept in step
    # Pretty-printed. ("name" is in the first lines on both lanes: PostgreSQL's jsonb orders keys by length.)
    assert '\n  "name": "greeter",\n' in page.inner_text(".definition-editor .ace_content")

    bad = {**GREETER, "execution": {"autonomy": "A9"}}
    _type_into_the_editor(page, json.dumps(bad, indent=2))
    page.wait_for_selector(
        ".definition-editor .jsoneditor-validation-error-count"
    )  # the schema, before saving
    page.shot("definition-editor-schema-error")
    assert json.loads(page.input_value("#id_definition")) == bad
    page.click("input[name=_continue]")
    page.wait_for_selector(".field-definition .errorlist")  # the server's check, inline
    assert "/execution/autonomy" in page.inner_text(".field-definition .errorlist")
    page.wait_for_selector(".definition-editor .jsoneditor")  # and the editor again, with the text as sent
    shown = page.evaluate("document.querySelector('.definition-editor').jsonEditor.getText()")
    assert json.loads(shown) == bad  # the text as sent, to fix

    good = {**GREETER, "execution": {"autonomy": "A2"}}
    _type_into_the_editor(page, json.dumps(good))
    page.click("input[name=_continue]")
    page.wait_for_selector(".messagelist .success")
    automation.refresh_from_db()
    assert automation.version == 2
    assert automation.definition["execution"] == {"autonomy": "A2"}


def test_without_javascript_the_definition_is_a_plain_textarea(
    live_server, operator_account, monkeypatch, tmp_path
):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    automation = services.automation_create(
        workspace=operator_account.memberships.get().workspace, definition=GREETER, user=operator_account
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(java_script_enabled=False).new_page()
            page.set_default_timeout(30_000)
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", "opal")
            page.fill("#id_password", "pw-opal")
            page.click("input[type=submit]")
            page.goto(f"{live_server.url}/admin/automations/automation/{automation.pk}/change/")
            page.screenshot(path=str(tmp_path / "definition-no-js.png"), full_page=True)

            assert page.is_visible("#id_definition")
            assert not page.is_visible(".definition-editor")
            assert '\n  "schema_version": "1.0"' in page.input_value("#id_definition")  # pretty-printed
            page.fill("#id_definition", json.dumps({**GREETER, "name": "greeter, edited without JS"}))
            page.click("input[name=_continue]")
            page.wait_for_selector(".messagelist .success")
        finally:
            connections.close_all()
            browser.close()
    automation.refresh_from_db()
    assert automation.name == "greeter, edited without JS"
