"""No 500s in the admin: every registered model's changelist, add page and change page (for one
object of each), and the console's own pages, GET as a superuser and as staff of each role
(viewer, operator, approver, admin).

Staff get every model permission of the admin (viewers: view only), so what limits them is their
workspace role, as in production. The test client re-raises a view's exception, so a 500 fails here
with its traceback.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from approvals.models import Approval, StandingApproval
from audit.checkpoints import checkpoint_write
from audit.sequencer import sequence_pending
from automations import events, services
from automations.models import Draft, Run, RunStatus
from capabilities.credentials import credential_create
from capabilities.models import McpServer, McpTool
from notifications.models import Delivery
from notifications.services import channel_create
from ops.models import Heartbeat
from tests.factories import api_token, member
from triggers.models import Trigger, WebhookRateWindow
from workspaces.models import Role
from workspaces.services import workspace_get_or_create

pytestmark = pytest.mark.django_db

ROLES = ["superuser", Role.ADMIN, Role.OPERATOR, Role.APPROVER, Role.VIEWER]


@pytest.fixture
def world(drive):
    """One object of every model the admin shows."""
    workspace = workspace_get_or_create(slug="acme")
    owner = member("owner", workspace, Role.ADMIN)
    automation = services.automation_create(workspace=workspace, user=owner, definition={
        "schema_version": "1.0", "name": "smoke",
        "inputs": {"schema": {"type": "object", "properties": {"who": {"type": "string", "default": "x"}}}},
        "triggers": [{"key": "nightly", "type": "schedule", "config": {"cron": "0 9 * * *"}},
                     {"key": "hook", "type": "webhook", "config": {}}],
        "plan": [{"step_id": "a", "action": "transform_data", "config": {"output": 1}}],
    })  # fmt: skip
    services.automation_update(automation=automation, user=owner, definition={
        **automation.definition, "plan": [{"step_id": "a", "action": "transform_data", "config": {"output": 2}}]})  # fmt: skip
    run = drive(services.run_create(automation=automation, inputs={}, user=owner).run.pk)
    stuck = services.run_create(automation=automation, inputs={}, user=owner).run
    rerun = services.run_rerun(run=run, user=owner)  # a chain: the run page links parent and child
    Run.objects.filter(pk=stuck.pk).update(status=RunStatus.NEEDS_ATTENTION)
    Approval.objects.create(
        workspace=workspace, run_id=run.pk, automation_id=automation.pk, automation_name="smoke", step_key="plan:0:a",
        step_id="a", action="http_request", capability_id="http_request", risk="high", what={"url": "http://x"},
        plan_hash="0" * 64, trace_id=run.trace_id, expires_at=timezone.now() + timedelta(hours=1),
    )  # fmt: skip
    StandingApproval.objects.create(workspace=workspace, automation_id=automation.pk, capability_id="http_request",
                                    max_uses=1, expires_at=timezone.now() + timedelta(days=1))  # fmt: skip
    credential = credential_create(
        workspace=workspace, name="crm", kind="bearer", secret={"token": "tok-smoke-1"}
    )
    server = McpServer.objects.create(workspace=workspace, slug="tools", name="tools", url="http://127.0.0.1:9/mcp",
                                      credential=credential)  # fmt: skip
    McpTool.objects.create(server=server, name="echo", schema_hash="1" * 64, approved_hash="2" * 64,
                           last_seen=timezone.now())  # fmt: skip
    events.publish_event(workspace_id=workspace.id, event_type="smoke.tested", payload={}, source="api")
    Draft.objects.create(workspace=workspace, automation=automation, prompt="p", prompt_sha256="0" * 64, model="m",
                         definition=automation.definition, expires_at=timezone.now() + timedelta(hours=1))  # fmt: skip
    WebhookRateWindow.objects.create(trigger=Trigger.objects.get(key="hook"), window_start=1, hits=1)
    Heartbeat.objects.create(
        name="worker@smoke", kind="worker", started_at=timezone.now(), seen_at=timezone.now()
    )
    workspace.egress_allowlist = ["127.0.0.1"]  # the channel's (unreachable) local receiver
    workspace.save(update_fields=["egress_allowlist"])
    channel, _ = channel_create(workspace=workspace, user=owner, kind="webhook", name="hook",
                                url="http://127.0.0.1:9/hook")  # fmt: skip
    channel_create(workspace=workspace, user=owner, kind="email", name="mail", to=["role:approver"])
    Delivery.objects.create(approval=Approval.objects.get(), workspace=workspace, channel=channel, kind="webhook",
                            notice="requested", status="failed", attempts=5, last_error="HTTP 500")  # fmt: skip
    Group.objects.create(name="operators")
    api_token(owner, name="smoke", expires_at=timezone.now() + timedelta(days=1))
    login = {"username": "someone", "ip_address": "198.51.100.7", "user_agent": "smoke", "http_accept": "*/*",
             "path_info": "/admin/login/"}  # fmt: skip
    AccessAttempt.objects.create(**login, get_data="", post_data="", failures_since_start=1)
    AccessLog.objects.create(**login)
    AccessFailureLog.objects.create(**login, locked_out=False)
    sequence_pending()
    checkpoint_write()
    return {"workspace": workspace, "automation": automation, "run": run, "stuck": stuck, "rerun": rerun}


def _client(role: str, workspace) -> Client:
    if role == "superuser":
        user = get_user_model().objects.create_superuser("root", password="pw")
    else:
        user = member(f"staff-{role}", workspace, role, is_staff=True)
        perms = AuthPermission.objects.all()
        user.user_permissions.add(
            *(perms.filter(codename__startswith="view_") if role == Role.VIEWER else perms)
        )
    client = Client()
    client.force_login(user)
    return client


def _pages(world) -> list[str]:
    urls = [reverse("admin:index")]
    for model in admin.site._registry:
        info = model._meta.app_label, model._meta.model_name
        urls.append(reverse("admin:{}_{}_changelist".format(*info)))
        try:
            urls.append(reverse("admin:{}_{}_add".format(*info)))
        except NoReverseMatch:
            pass
        obj = model._default_manager.order_by("pk").first()
        assert obj is not None, f"the smoke world has no {model._meta.label}"
        urls.append(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
    run, stuck, automation = world["run"], world["stuck"], world["automation"]
    urls += [
        reverse("admin:automations_run_change", args=[run.pk]),
        reverse("admin:automations_run_change", args=[stuck.pk]),
        reverse("admin:automations_run_change", args=[world["rerun"].pk]),
        reverse("admin:automations_automation_change", args=[automation.pk]),
        reverse("admin:automations_run_cancel", args=[stuck.pk]),
        reverse("admin:automations_run_rerun", args=[run.pk]),
        reverse("admin:automations_run_resolve", args=[stuck.pk]),
        reverse("admin:automations_automation_run", args=[automation.pk]),
        reverse("admin:automations_automation_restore", args=[automation.pk, 1]),
        reverse("admin:audit_auditevent_changelist") + f"?trace_id={run.trace_id}",
        reverse("admin:approvals_approval_changelist") + "?status__exact=all",
        reverse("admin:approvals_approval_changelist") + f"?run_id={run.pk}&status__exact=all",
        reverse("admin:automations_run_changelist") + f"?parent_run={run.pk}",
    ]
    return urls


@pytest.mark.parametrize("role", ROLES)
def test_no_admin_page_answers_5xx(world, role):
    client = _client(role, world["workspace"])
    answered = {}
    for url in _pages(world):
        answered[url] = client.get(url).status_code

    assert {url: code for url, code in answered.items() if code >= 500} == {}
    assert answered[reverse("admin:automations_run_change", args=[world["run"].pk])] == 200
    assert answered[reverse("admin:automations_automation_change", args=[world["automation"].pk])] == 200


def test_a_tool_changed_since_approval_is_flagged_in_words_not_a_green_tick(world):
    page = _client("superuser", world["workspace"]).get(reverse("admin:capabilities_mcptool_changelist"))

    body = page.content.decode()
    assert "CHANGED — re-approve" in body
    assert "icon-yes.svg" not in body


def test_a_credential_page_shows_only_its_kinds_fields(world):
    admin = _client("superuser", world["workspace"])
    bearer = world["workspace"].credentials.get(name="crm")

    change = admin.get(reverse("admin:capabilities_credential_change", args=[bearer.pk])).content.decode()
    add = admin.get(reverse("admin:capabilities_credential_add")).content.decode()

    assert 'name="secret"' in change
    assert 'name="username"' not in change
    assert 'name="client_secret"' not in change
    assert "capabilities/credential_kind.js" in add  # the add page hides the other kinds' fields
