"""The operator console, one browser journey per role (issue 15), on a real worker.

Headless Debian Chromium through Playwright (never a downloaded browser). Each journey logs in
as staff of one workspace role and goes where an operator goes: the home page (a pending
approval, a failed run), approving, fixing a definition (inline error, no 500), Run with inputs,
re-running from step 2, resolving a needs-attention run, opening its audit trace. Each role does
what it may and is refused, in words on the page, what it may not. Every role has the same Django
model permissions: what limits each one is its workspace role, as the services decide.

Each page is screenshotted into the test's artifacts directory: ``$AUTOPLANE_TEST_ARTIFACTS/<test>``
when that is set (CI keeps it), else the test's tmp dir. Waits are for a selector, a text or a
row in the database, never sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.db import connections
from playwright.sync_api import Page, expect, sync_playwright

from approvals.models import Approval, ApprovalStatus
from audit.models import AuditEvent
from automations import services
from automations.models import Automation, Run, RunStatus, StepRun, StepStatus
from tests import live
from tests.factories import definition, http_step, member, transform
from workspaces.models import Role

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip

pytestmark = [
    pytest.mark.browser,
    pytest.mark.workers,
    pytest.mark.skipif(
        not CHROMIUM.exists() and shutil.which("chromium") is None,
        reason="Debian chromium is not installed (apt-get install -y chromium)",
    ),
]

SETTLED = {RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.NEEDS_ATTENTION, RunStatus.CANCELLED,
           RunStatus.TIMED_OUT}  # fmt: skip


def greeter(*, broken: bool = False) -> dict:
    """Two steps, so a re-run can start from the second; ``broken`` names an action that does not exist."""
    return definition(
        {**transform("greet", {"message": "Hello, {{ inputs.who }}!"}), "output_as": "greeting",
         **({"action": "transform_dat"} if broken else {})},
        transform("shout", "{{ greeting.message | upper }}"),
        name="greeter", inputs_schema={"type": "object", "required": ["who"],
                                       "properties": {"who": {"type": "string", "minLength": 2}}},
    )  # fmt: skip


class _Upstream(BaseHTTPRequestHandler):
    """POST /ok answers 200 (the gated side effect); GET /down answers 503 (a failing run)."""

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ok = self.path == "/ok"
        body = b'{"ok": true}' if ok else b'{"error": "maintenance"}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def sent() -> None:
    """Here messages really go to the broker (overrides any capturing fixture)."""


def settled(run_id, statuses=SETTLED) -> Run:
    return live.wait_for_run(run_id, statuses)


@pytest.fixture
def world(celery_workers, workspace, owner, upstream, settings) -> SimpleNamespace:
    """What the journeys find: a run parked on an approval, a failed run, a run that needs attention
    (each made by the real worker), and the greeter automation to edit, run and re-run."""
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]  # the local upstream: loopback, deny-listed otherwise
    gated = services.automation_create(workspace=workspace, user=owner, definition=definition(
        http_step("create_item", f"{upstream}/ok", "POST"), name="pay-invoices", autonomy="A2"))  # fmt: skip
    flaky = services.automation_create(workspace=workspace, user=owner, definition=definition(
        {**http_step("fetch", f"{upstream}/down"), "max_retries": 0}, name="sync-crm"))  # fmt: skip
    charge = services.automation_create(workspace=workspace, user=owner, definition=definition(
        transform("prepare", {"amount": 42}),
        {**transform("charge", {"charged": 42}), "output_as": "payment"},
        transform("receipt", "receipt for {{ payment.charged }}"), name="charge-card"))  # fmt: skip
    automation = services.automation_create(workspace=workspace, user=owner, definition=greeter())

    parked, failed, stuck = (
        services.run_create(automation=a, inputs={}, user=owner).run for a in (gated, flaky, charge)
    )
    parked = settled(parked.pk, {RunStatus.AWAITING_APPROVAL, *SETTLED})
    assert parked.status == RunStatus.AWAITING_APPROVAL, (parked.error, celery_workers.main.log_tail())
    failed = settled(failed.pk)
    assert failed.status == RunStatus.FAILED, (failed.status, failed.error)
    # The state a worker dying inside the non-idempotent "charge" step leaves (the executor's
    # outcome-unknown path, tested live in tests/automations and tests/chaos): charge failed with
    # OUTCOME_UNKNOWN, receipt not started, the run waiting for an operator.
    assert settled(stuck.pk).status == RunStatus.SUCCEEDED
    message = "the worker stopped during this step; whether its side effect happened is unknown"
    StepRun.objects.filter(run=stuck, step_id="receipt").delete()
    StepRun.objects.filter(run=stuck, step_id="charge").update(status=StepStatus.FAILED, error_code="OUTCOME_UNKNOWN",
                                                               error_message=message, output=None)  # fmt: skip
    Run.objects.filter(pk=stuck.pk).update(
        status=RunStatus.NEEDS_ATTENTION, step_index=1, finished_at=None, output=None,
        error={"code": "OUTCOME_UNKNOWN", "message": message, "step_id": "charge"},
    )  # fmt: skip
    return SimpleNamespace(workspace=workspace, approval=Approval.objects.get(run_id=parked.pk), parked=parked,
                           failed=failed, stuck=Run.objects.get(pk=stuck.pk), automation=automation)  # fmt: skip


@pytest.fixture
def artifacts(request, tmp_path) -> Path:
    root = os.environ.get("AUTOPLANE_TEST_ARTIFACTS")
    path = Path(root) / request.node.name if root else tmp_path / "artifacts"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browse(live_server, artifacts, monkeypatch):
    """``browse(user) -> page`` logged in as ``user``; ``page.shot(name)`` screenshots the whole page."""
    # Playwright's sync API keeps an event loop on this thread; the ORM calls here are plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        shots = iter(range(1, 100))

        def login(user) -> Page:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(30_000)
            expect.set_options(timeout=30_000)
            page.base = live_server.url
            page.shot = lambda name: page.screenshot(path=str(artifacts / f"{next(shots):02d}-{name}.png"),
                                                     full_page=True)  # fmt: skip
            page.goto(f"{live_server.url}/admin/login/")
            page.fill("#id_username", user.username)
            page.fill("#id_password", f"pw-{user.username}")
            page.click("input[type=submit]")
            expect(page.locator("#needs-me")).to_be_visible()
            return page

        try:
            yield login
        finally:
            # ORM calls made while Playwright's event loop runs get their own connection (Django keys
            # connections by async context there): close it, or the test database cannot be dropped.
            connections.close_all()
            browser.close()


def staff(username: str, workspace, role: str):
    """Staff with every model permission of the console: the workspace role is what limits them."""
    user = member(username, workspace, role, is_staff=True)
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label__in=["automations", "approvals", "audit", "triggers", "workspaces"]))  # fmt: skip
    return user


# --- the steps of a journey --------------------------------------------------------------


def home_shows_the_problems(page: Page, world, *, approver: bool) -> None:
    page.goto(f"{page.base}/admin/")
    page.shot("home")
    needs = page.locator("#needs-me")
    expect(needs).to_contain_text("Pending approvals")
    expect(page.locator("#recent-problems")).to_contain_text("sync-crm")
    expect(page.locator("#recent-problems")).to_contain_text("HTTP 503")
    expect(page.locator("#recent-problems")).to_contain_text("charge-card")
    mine = page.locator("#approvals-for-me")
    if approver:
        expect(mine).to_contain_text("pay-invoices / create_item")
        expect(mine).to_contain_text("/ok")  # what will run: the URL it will POST to
        # ... legibly: a few lines, not one character per line down the page.
        what = mine.locator("code").first.bounding_box()
        assert what is not None
        assert what["height"] < 80 < what["width"], what
    else:
        expect(mine).to_have_count(0)
    assert "Server Error" not in page.content()


def approve_from_home(page: Page, world) -> None:
    page.goto(f"{page.base}/admin/")
    page.locator("#approvals-for-me").get_by_role("link", name="Review…").click()
    expect(page.locator("#approval-what")).to_contain_text("/ok")
    page.shot("approval")
    page.click("#approve-button")
    expect(page.locator(".messagelist .success")).to_contain_text("now approved")
    expect(page.locator("#approve-button")).to_have_count(0)
    page.shot("approved")
    done = settled(world.parked.pk)
    assert done.status == RunStatus.SUCCEEDED, done.error
    assert Approval.objects.get(pk=world.approval.pk).status == ApprovalStatus.CONSUMED


def may_not_approve(page: Page, world) -> None:
    page.goto(f"{page.base}/admin/")
    page.locator("#needs-me").get_by_role("link", name="Pending approvals").click()
    expect(page.locator("#result_list")).to_contain_text("pay-invoices")
    page.shot("approvals")
    page.locator("#result_list tbody tr").filter(has_text="pay-invoices").locator("a").first.click()
    expect(page.locator("#approval-what")).to_contain_text("/ok")
    expect(page.locator("body")).to_contain_text("your role in this workspace does not allow approving")
    expect(page.locator("#approve-button")).to_have_count(0)
    page.shot("approval-not-mine")
    assert Approval.objects.get(pk=world.approval.pk).status == ApprovalStatus.PENDING


def _set_definition(page: Page, doc: dict) -> None:
    # The underlying textarea, whatever editor is drawn over it.
    page.locator("#id_definition").evaluate(
        "(el, text) => { el.value = text; el.dispatchEvent(new Event('input', {bubbles: true}));"
        " el.dispatchEvent(new Event('change', {bubbles: true})); }",
        json.dumps(doc, indent=2),
    )


def fix_the_definition(page: Page, world) -> None:
    page.goto(f"{page.base}/admin/automations/automation/{world.automation.pk}/change/")
    page.shot("automation")
    _set_definition(page, greeter(broken=True))
    page.click("input[name=_continue]")
    errors = page.locator(".field-definition .errorlist")
    expect(errors).to_contain_text("transform_dat")
    assert "Server Error" not in page.content()
    page.shot("definition-error")
    assert Automation.objects.get(pk=world.automation.pk).version == 1

    fixed = greeter()
    fixed["plan"][1]["config"]["output"] = "{{ greeting.message | upper }}!"
    _set_definition(page, fixed)
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist .success")).to_contain_text("was changed successfully")
    page.shot("definition-saved")
    assert Automation.objects.get(pk=world.automation.pk).version == 2


def run_with_inputs(page: Page, world) -> Run:
    page.goto(f"{page.base}/admin/automations/automation/{world.automation.pk}/change/")
    page.click("#run-button")
    page.fill("#id_in_who", "Ada")
    page.shot("run-form")
    page.click("#start-run")
    expect(page.locator(".messagelist .success")).to_contain_text("queued")
    run = Run.objects.filter(automation=world.automation).get()
    assert str(run.pk)[:8] in page.url or str(run.pk) in page.url
    return watch_it_succeed(page, run, "HELLO, ADA!!")


def watch_it_succeed(page: Page, run: Run, output: str) -> Run:
    done = settled(run.pk)
    assert done.status == RunStatus.SUCCEEDED, done.error
    page.reload()
    expect(page.locator(".field-run_status")).to_contain_text("succeeded")
    expect(page.locator(".field-pretty_output")).to_contain_text(output)
    page.shot(f"run-{str(run.pk)[:8]}-succeeded")
    return done


def rerun_from_step_2(page: Page, run: Run) -> Run:
    page.goto(f"{page.base}/admin/automations/run/{run.pk}/change/")
    page.click("#rerun-button")
    page.select_option("#id_from_step", "shout")
    page.shot("rerun-form")
    page.click("#confirm-button")
    expect(page.locator(".messagelist .success")).to_contain_text("queued from step shout")
    child = Run.objects.get(parent_run=run)
    expect(page.locator("#parent-link")).to_contain_text(str(run.pk)[:8])  # the re-run's own page
    done = watch_it_succeed(page, child, "HELLO, ADA!!")
    # Step 1's output was reused, not recomputed: only "shout" ran in the re-run.
    assert list(done.steps.values_list("step_id", "attempt").order_by("index")) == [
        ("greet", run.steps.get(step_id="greet").attempt), ("shout", 1)]  # fmt: skip
    return done


def resolve_needs_attention(page: Page, world) -> None:
    page.goto(f"{page.base}/admin/")
    page.locator("#recent-problems").get_by_role("link", name=str(world.stuck.pk)[:8]).click()
    expect(page.locator(".field-run_status")).to_contain_text("needs_attention")
    expect(page.locator(".field-pretty_error")).to_contain_text("OUTCOME_UNKNOWN")
    page.click("#resolve-button")
    page.check("input[name=resolution][value=succeeded]")
    page.fill("#id_reason", "the payment provider shows the charge")
    page.fill("#id_output", '{"charged": 42}')
    page.shot("resolve-form")
    page.click("#confirm-button")
    expect(page.locator(".messagelist .success")).to_contain_text("resolved (succeeded)")
    watch_it_succeed(page, world.stuck, "receipt for 42")


def open_its_trace(page: Page, run: Run, *, resolved: bool) -> None:
    page.goto(f"{page.base}/admin/automations/run/{run.pk}/change/")
    page.click("#trace-link")
    expect(page.locator("#content h1, #content h2").first).to_contain_text(f"Audit trace {run.trace_id}")
    rows = page.locator("#result_list")
    expect(rows).to_contain_text("run.created")
    # Every column, the summary included, fits the 1400 px window: no scrolling sideways in the list.
    assert page.evaluate("document.querySelector('#result_list').scrollWidth") <= page.evaluate(
        "document.querySelector('#changelist .results').clientWidth"
    )
    expect(rows.locator("td.field-summary_line").last).to_be_visible()
    if resolved:
        expect(rows).to_contain_text("operator.run.resolved")
        expect(rows).to_contain_text("operator resolved the run: succeeded")
        assert AuditEvent.objects.filter(trace_id=run.trace_id, type="operator.run.resolved").exists()
    page.shot("trace")


def may_not_operate(page: Page, world) -> None:
    """No Run / Re-run / Resolve buttons; and going to those pages anyway is refused in words."""
    page.goto(f"{page.base}/admin/automations/automation/{world.automation.pk}/change/")
    expect(page.locator("#content h1")).to_have_text("View automation")
    expect(page.locator("#definition")).to_contain_text('"greeting"')  # read, not edited
    for absent in ("#run-button", "#id_definition", "input[name=_save]", ".deletelink"):
        expect(page.locator(absent)).to_have_count(0)
    page.shot("automation-read-only")
    page.goto(f"{page.base}/admin/automations/run/{world.failed.pk}/change/")
    expect(page.locator(".field-run_status")).to_contain_text("failed")
    expect(page.locator("#rerun-button")).to_have_count(0)
    page.goto(f"{page.base}/admin/automations/run/{world.stuck.pk}/change/")
    expect(page.locator(".field-run_status")).to_contain_text("needs_attention")
    expect(page.locator("#resolve-button")).to_have_count(0)
    page.shot("run-read-only")

    page.goto(f"{page.base}/admin/automations/run/{world.failed.pk}/rerun/")
    page.click("#confirm-button")
    expect(page.locator(".messagelist .error")).to_contain_text("does not allow")
    page.goto(f"{page.base}/admin/automations/automation/{world.automation.pk}/run/")
    page.fill("#id_in_who", "Ada")
    page.click("#start-run")
    expect(page.locator(".messagelist .error, #run-form .errornote")).to_contain_text("does not allow")
    page.shot("refused")
    assert not Run.objects.filter(parent_run=world.failed).exists()
    assert not Run.objects.filter(automation=world.automation).exists()
    assert Run.objects.get(pk=world.stuck.pk).status == RunStatus.NEEDS_ATTENTION


# --- one journey per role ----------------------------------------------------------------


def test_admin_journey(world, browse):
    page = browse(staff("ada-admin", world.workspace, Role.ADMIN))
    home_shows_the_problems(page, world, approver=True)
    approve_from_home(page, world)
    fix_the_definition(page, world)
    run = run_with_inputs(page, world)
    rerun_from_step_2(page, run)
    resolve_needs_attention(page, world)
    open_its_trace(page, world.stuck, resolved=True)


def test_operator_journey(world, browse):
    page = browse(staff("otto-operator", world.workspace, Role.OPERATOR))
    home_shows_the_problems(page, world, approver=False)
    may_not_approve(page, world)
    fix_the_definition(page, world)
    run = run_with_inputs(page, world)
    rerun_from_step_2(page, run)
    resolve_needs_attention(page, world)
    open_its_trace(page, world.stuck, resolved=True)


def test_approver_journey(world, browse):
    page = browse(staff("april-approver", world.workspace, Role.APPROVER))
    home_shows_the_problems(page, world, approver=True)
    approve_from_home(page, world)
    may_not_operate(page, world)
    open_its_trace(page, world.parked, resolved=False)


def test_viewer_journey(world, browse):
    page = browse(staff("vera-viewer", world.workspace, Role.VIEWER))
    home_shows_the_problems(page, world, approver=False)
    may_not_approve(page, world)
    may_not_operate(page, world)
    open_its_trace(page, world.failed, resolved=False)
