"""Every admin action checks the user's role in the object's workspace and leaves an audit row when
it acts (issue 15). Staff here hold every Django model permission: what refuses them is their
workspace role, as in the services and the API.

``ACTIONS`` names where each registered action is tested; a new action without a test fails
``test_every_admin_action_is_listed_here``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval, ApprovalStatus, StandingApproval
from approvals.services import standing_approval_create
from audit.checkpoints import checkpoint_write
from audit.models import AuditChainHead, AuditCheckpoint, AuditEvent
from audit.sequencer import sequence_pending
from automations import services
from automations.models import Automation, Run, RunStatus
from capabilities.credentials import credential_create
from capabilities.models import McpServer, McpTool
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

HERE = "tests/test_admin_actions.py"
ACTIONS = {
    "automations.automation": {"run_now": "tests/automations/test_admin_actions.py", "pause": "ditto",
                               "resume": HERE, "purge": HERE, "delete_selected": HERE,
                               "activate_reviewed": "tests/automations/test_as_code.py"},
    "automations.run": {"cancel": "tests/automations/test_admin_actions.py", "rerun": "ditto",
                        "resolve_retry": "ditto", "resolve_failed": "ditto", "resolve_succeeded": HERE},
    "approvals.approval": {"approve_selected": HERE, "deny_selected": HERE},
    "approvals.standingapproval": {"revoke_selected": HERE},
    "audit.auditevent": {"verify_chain": HERE},
    "audit.auditcheckpoint": {"verify_chain": HERE, "write_checkpoint_now": HERE},
    "audit.auditchainhead": {"verify_chain": HERE},
    "capabilities.credential": {"delete_selected": HERE},
    "notifications.channel": {"delete_selected": "tests/notifications/test_admin.py"},
    "capabilities.mcpserver": {"harvest_now": HERE, "delete_selected": HERE},
    "capabilities.mcptool": {"reapprove": HERE, "risk_low": HERE, "risk_medium": HERE, "risk_high": HERE,
                             "risk_critical": HERE, "risk_default": HERE},
    "workspaces.apitoken": {"revoke": "tests/api/test_api_tokens.py"},
    "triggers.trigger": {"rotate_token": "tests/triggers/test_triggers_api.py", "revoke_token": "ditto",
                         "rotate_signing_secret": "ditto"},
    # Django's own delete of rows that belong to no workspace (superusers, or staff given the permission).
    "auth.user": {"delete_selected": "django"}, "auth.group": {"delete_selected": "django"},
    "triggers.webhookratewindow": {"delete_selected": "django"}, "ops.heartbeat": {"delete_selected": "django"},
    # django-axes' login lockouts (tests/ops/test_admin_login_throttle.py): deleting an attempt unlocks it.
    "axes.accessattempt": {"cleanup_expired_attempts": "django-axes", "delete_selected": "django-axes"},
    "axes.accessfailurelog": {"delete_selected": "django-axes"}, "axes.accesslog": {"delete_selected": "django-axes"},
}  # fmt: skip


def test_every_admin_action_is_listed_here():
    root = get_user_model().objects.create_superuser("root", password="pw")
    request = type("Request", (), {"user": root, "GET": {}, "POST": {}})()
    registered = {}
    for model, model_admin in admin.site._registry.items():
        names = sorted(model_admin.get_actions(request))
        if names:
            registered[model._meta.label_lower] = names
    listed = {model: sorted(names) for model, names in ACTIONS.items()}
    assert registered == listed


# --- helpers ------------------------------------------------------------------------------


def staff(user, *, superuser: bool = False) -> Client:
    user.is_staff = True
    user.is_superuser = superuser
    user.save(update_fields=["is_staff", "is_superuser"])
    user.user_permissions.add(*AuthPermission.objects.all())
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, model: str, action: str, *ids, status: int = 200, **extra) -> str:
    """Post the action for ``ids`` and return the page it ends on (its messages: capitalised)."""
    app, name = model.split(".")
    response = client.post(reverse(f"admin:{app}_{name}_changelist"),
                           {"action": action, ACTION_CHECKBOX_NAME: [str(i) for i in ids], **extra}, follow=True)  # fmt: skip
    assert response.status_code == status
    return response.content.decode()


def audited(type_: str, **filters) -> int:
    return AuditEvent.objects.filter(type=type_, **filters).count()


@pytest.fixture
def automation(workspace, owner):
    return services.automation_create(workspace=workspace, user=owner,
                                      definition=definition(transform("a", 1), transform("b", 2), name="acts"))  # fmt: skip


# --- automations ----------------------------------------------------------------------------


def test_resume_refuses_a_viewer(automation, viewer, operator):
    Automation.objects.filter(pk=automation.pk).update(status="paused")

    assert "does not allow" in act(staff(viewer), "automations.automation", "resume", automation.pk)
    assert Automation.objects.get(pk=automation.pk).status == "paused"
    assert audited("automation.resumed") == 0


def test_delete_archives_only_for_an_operator(automation, viewer, operator):
    url = reverse("admin:automations_automation_delete", args=[automation.pk])
    assert staff(viewer).post(url, {"post": "yes"}).status_code == 403
    refused = act(staff(viewer), "automations.automation", "delete_selected", automation.pk, post="yes")
    assert "does not allow" in refused
    assert Automation.objects.get(pk=automation.pk).archived_at is None
    assert audited("automation.archived") == 0

    act(staff(operator), "automations.automation", "delete_selected", automation.pk, post="yes")

    assert Automation.objects.get(pk=automation.pk).archived_at is not None
    assert audited("automation.archived", actor="user:operator") == 1


def test_purge_is_a_superusers(automation, owner, operator):
    services.automation_archive(automation=automation, user=owner)

    assert "Only a superuser" in act(staff(owner), "automations.automation", "purge", automation.pk)
    assert Automation.objects.filter(pk=automation.pk).exists()
    assert audited("automation.purged") == 0

    root = get_user_model().objects.create_user("root", password="pw")
    assert "purged" in act(staff(root, superuser=True), "automations.automation", "purge", automation.pk)
    assert not Automation.objects.filter(pk=automation.pk).exists()
    assert audited("automation.purged", actor="user:root") == 1


def test_resolve_succeeded_refuses_a_viewer_and_continues_for_an_operator(automation, viewer, operator):
    run = services.run_create(automation=automation, inputs={}, user=operator).run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION)

    assert "does not allow" in act(staff(viewer), "automations.run", "resolve_succeeded", run.pk)
    assert Run.objects.get(pk=run.pk).status == RunStatus.NEEDS_ATTENTION
    assert audited("operator.run.resolved") == 0

    assert "resolved as succeeded" in act(staff(operator), "automations.run", "resolve_succeeded", run.pk)
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    event = AuditEvent.objects.get(type="operator.run.resolved")
    assert (event.actor, event.payload["resolution"]) == ("user:operator", "succeeded")


# --- approvals ------------------------------------------------------------------------------


@pytest.fixture
def asking(drive, owner):
    """Two runs, each parked on a require_approval step."""
    automation = drive.automation(definition(
        {"step_id": "ask", "action": "require_approval", "config": {"message": "go on?"}}, name="asks"))  # fmt: skip
    return [drive.approval(drive.start(automation, user=owner)) for _ in range(2)]


@pytest.mark.parametrize(("action", "decided", "extra"), [
    ("approve_selected", "approval.approved", {}),
    ("deny_selected", "approval.denied", {"apply": "1", "reason": "not today"}),
])  # fmt: skip
def test_deciding_from_the_list_refuses_an_operator_and_works_for_an_approver(
    people, asking, action, decided, extra
):
    approval = asking[0]

    refused = act(staff(people.operator), "approvals.approval", action, approval.pk, **extra)
    assert "does not allow" in refused
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert audited(decided) == 0

    act(staff(people.alice), "approvals.approval", action, approval.pk, **extra)
    assert Approval.objects.get(pk=approval.pk).status != ApprovalStatus.PENDING
    assert audited(decided, actor="user:alice") == 1


def test_revoking_a_standing_approval_refuses_an_operator(people, drive):
    automation = drive.automation(definition(transform("a", 1), name="standing"))
    standing = standing_approval_create(
        workspace=people.workspace, automation_id=automation.pk, capability_id="http_request", max_uses=3,
        expires_at=timezone.now() + timedelta(days=1), user=people.alice,
    )  # fmt: skip

    assert "does not allow" in act(staff(people.operator), "approvals.standingapproval", "revoke_selected",
                                   standing.pk)  # fmt: skip
    assert not StandingApproval.objects.get(pk=standing.pk).revoked
    assert audited("approval.standing.revoked") == 0

    assert "revoked" in act(staff(people.alice), "approvals.standingapproval", "revoke_selected", standing.pk)
    assert StandingApproval.objects.get(pk=standing.pk).revoked
    assert audited("approval.standing.revoked", actor="user:alice") == 1


# --- audit ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["audit.auditevent", "audit.auditcheckpoint", "audit.auditchainhead"])
def test_verifying_is_read_only_and_open_to_every_role(automation, viewer, model):
    sequence_pending()
    checkpoint_write()
    rows = {"audit.auditevent": AuditEvent, "audit.auditcheckpoint": AuditCheckpoint,
            "audit.auditchainhead": AuditChainHead}  # fmt: skip
    before = AuditEvent.objects.count()

    page = act(staff(viewer), model, "verify_chain", rows[model].objects.values_list("pk", flat=True).first())

    assert "Audit ledger OK" in page
    assert AuditEvent.objects.count() == before  # verification writes nothing


def test_writing_a_checkpoint_needs_the_permission(automation, viewer, owner):
    sequence_pending()
    first = checkpoint_write()[0]
    services.automation_update(automation=automation, user=owner, status="paused")  # the chain moves on
    sequence_pending()
    client = Client()
    viewer.is_staff = True
    viewer.save(update_fields=["is_staff"])
    viewer.user_permissions.add(AuthPermission.objects.get(codename="view_auditcheckpoint"))
    client.force_login(viewer)

    assert "You may not write checkpoints" in act(
        client, "audit.auditcheckpoint", "write_checkpoint_now", first.pk
    )
    assert AuditCheckpoint.objects.count() == 1

    assert "1 checkpoint(s) written" in act(
        staff(owner), "audit.auditcheckpoint", "write_checkpoint_now", first.pk
    )
    assert AuditCheckpoint.objects.count() == 2


# --- capabilities (the workspace admin's, as in the API) -------------------------------------


@pytest.fixture
def mcp_world(workspace, owner):
    credential = credential_create(workspace=workspace, name="crm", kind="bearer", secret={"token": "tok-1"})
    server = McpServer.objects.create(workspace=workspace, slug="tools", name="tools",
                                      url="http://127.0.0.1:9/mcp", credential=credential)  # fmt: skip
    tool = McpTool.objects.create(server=server, name="echo", schema_hash="1" * 64, approved_hash="2" * 64,
                                  last_seen=timezone.now())  # fmt: skip
    return server, tool, credential


@pytest.mark.parametrize(("action", "recorded", "field", "value"), [
    ("reapprove", "mcp.tool.approved", "approved_hash", "1" * 64),
    ("risk_low", "mcp.tool.risk_set", "risk_override", "low"),
    ("risk_medium", "mcp.tool.risk_set", "risk_override", "medium"),
    ("risk_high", "mcp.tool.risk_set", "risk_override", "high"),
    ("risk_critical", "mcp.tool.risk_set", "risk_override", "critical"),
])  # fmt: skip
def test_tool_actions_refuse_an_operator_and_work_for_the_workspace_admin(
    mcp_world, operator, owner, action, recorded, field, value
):
    _, tool, _ = mcp_world
    before = getattr(tool, field)

    assert "does not allow" in act(staff(operator), "capabilities.mcptool", action, tool.pk)
    assert getattr(McpTool.objects.get(pk=tool.pk), field) == before
    assert audited(recorded) == 0

    act(staff(owner), "capabilities.mcptool", action, tool.pk)
    assert getattr(McpTool.objects.get(pk=tool.pk), field) == value
    assert audited(recorded, actor="user:owner") == 1


def test_clearing_the_risk_override_is_the_admins_too(mcp_world, operator, owner):
    _, tool, _ = mcp_world
    McpTool.objects.filter(pk=tool.pk).update(risk_override="low")

    assert "does not allow" in act(staff(operator), "capabilities.mcptool", "risk_default", tool.pk)
    assert McpTool.objects.get(pk=tool.pk).risk_override == "low"

    act(staff(owner), "capabilities.mcptool", "risk_default", tool.pk)
    assert McpTool.objects.get(pk=tool.pk).risk_override is None
    assert audited("mcp.tool.risk_set", actor="user:owner") == 1


def test_harvest_now_refuses_an_operator(mcp_world, operator, owner):
    server, _, _ = mcp_world

    assert "does not allow" in act(staff(operator), "capabilities.mcpserver", "harvest_now", server.pk)
    assert audited("mcp.server.harvest_failed") + audited("mcp.server.harvested") == 0

    act(staff(owner), "capabilities.mcpserver", "harvest_now", server.pk)  # nothing listens on port 9
    assert audited("mcp.server.harvest_failed", actor="user:owner") == 1


@pytest.mark.parametrize(("model", "recorded"), [("capabilities.mcpserver", "mcp.server.deleted"),
                                                 ("capabilities.credential", "credential.deleted")])  # fmt: skip
def test_deleting_is_the_workspace_admins(mcp_world, operator, owner, model, recorded):
    server, _, credential = mcp_world
    obj = server if model == "capabilities.mcpserver" else credential
    if model == "capabilities.credential":
        McpServer.objects.filter(pk=server.pk).update(credential=None)
    kind = type(obj)

    act(staff(operator), model, "delete_selected", obj.pk, post="yes", status=403)
    assert kind.objects.filter(pk=obj.pk).exists()
    assert audited(recorded) == 0

    act(staff(owner), model, "delete_selected", obj.pk, post="yes")
    assert not kind.objects.filter(pk=obj.pk).exists()
    assert audited(recorded, actor="user:owner") == 1


def test_another_workspaces_credentials_servers_and_tools_are_not_shown(mcp_world, outsider):
    client = staff(outsider)
    for obj in mcp_world:
        info = obj._meta.app_label, obj._meta.model_name
        listing = client.get(reverse("admin:{}_{}_changelist".format(*info))).content.decode()
        assert 'id="result_list"' not in listing, info
        detail = client.get(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
        assert detail.status_code == 302, info  # Django's "does not exist" redirect
