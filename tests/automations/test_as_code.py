"""Definitions as code (issue 34): export, apply (plan, dry run, prune, idempotence), review on import."""

from __future__ import annotations

import json
import threading
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.auth.models import Permission as AuthPermission
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations import as_code
from automations.models import Automation, AutomationStatus, Run, RunStatus
from automations.services import automation_create
from capabilities.credentials import credential_create
from tests.factories import client_for, definition, transform, webhook
from triggers.models import Trigger
from triggers.services import trigger_signing_secret_rotate, trigger_token_rotate
from workspaces.models import Workspace

CREDENTIAL_VALUE = "tok-VERY-SECRET-value-77"


def _call(*args: str) -> str:
    out = StringIO()
    call_command("automations", *args, stdout=out)
    return out.getvalue()


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir())}


def crm_step(step_id: str, url: str = "http://127.0.0.1:9/items", credential: str = "crm") -> dict:
    return {"step_id": step_id, "action": "http_request",
            "config": {"method": "GET", "url": url, "credential": credential}}  # fmt: skip


@pytest.fixture
def crm(workspace):
    return credential_create(workspace=workspace, name="crm", kind="bearer", secret={"token": CREDENTIAL_VALUE},
                             allowed_destinations=["127.0.0.1"])  # fmt: skip


@pytest.fixture
def hello(workspace, owner):
    return automation_create(workspace=workspace, user=owner, definition=definition(
        transform("greet", {"message": "hi {{ inputs.who }}"}, output_as="greeting"),
        name="Hello World", triggers=[webhook("hook")], autonomy="A3",
    ))  # fmt: skip


@pytest.fixture
def caller(workspace, owner, crm):
    return automation_create(workspace=workspace, user=owner, definition=definition(
        crm_step("fetch"), name="Calls CRM",
    ))  # fmt: skip


def test_export_writes_one_file_per_automation_byte_identical_and_without_secrets(
    tmp_path, workspace, hello, caller, owner
):
    trigger = Trigger.objects.get(automation=hello, key="hook")
    token = trigger_token_rotate(trigger=trigger)
    signing = trigger_signing_secret_rotate(trigger=trigger)
    _call("export", "--workspace", "acme", str(tmp_path / "a"))
    _call("export", "--workspace", "acme", str(tmp_path / "b"))
    first, second = _files(tmp_path / "a"), _files(tmp_path / "b")
    assert sorted(first) == ["calls-crm.json", "hello-world.json"]
    assert first == second  # no timestamps, no ids: byte-identical
    text = "".join(first.values())
    for secret in (CREDENTIAL_VALUE, token, signing, signing.removeprefix("whsec_")):
        assert secret not in text
    document = json.loads(first["calls-crm.json"])
    assert document == {"slug": "calls-crm", "status": "active", "definition": caller.definition}
    assert first["hello-world.json"] == json.dumps(
        json.loads(first["hello-world.json"]), sort_keys=True, indent=2, ensure_ascii=False
    ) + "\n"  # fmt: skip
    # the API answers the same document, byte for byte
    response = client_for(owner).get(f"/api/v1/automations/{caller.pk}/export")
    assert response.status_code == 200
    assert response.content.decode() == first["calls-crm.json"]


def test_round_trip_into_a_fresh_workspace_exports_identical_files(
    tmp_path, workspace, other_workspace, hello
):
    _call("export", "--workspace", "acme", str(tmp_path / "a"))
    out = _call("apply", str(tmp_path / "a"), "--workspace", "globex")
    assert "create     hello-world" in out
    _call("export", "--workspace", "globex", str(tmp_path / "b"))
    assert _files(tmp_path / "a") == _files(tmp_path / "b")
    assert Trigger.objects.filter(automation__workspace=other_workspace, key="hook").count() == 1


def test_yaml_export_applies_back_unchanged(tmp_path, workspace, hello):
    _call("export", "--workspace", "acme", "--format", "yaml", str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hello-world.yaml"]
    out = _call("apply", str(tmp_path), "--workspace", "acme")
    assert "unchanged  hello-world" in out


def test_apply_twice_changes_nothing_and_bumps_no_version(tmp_path, workspace, hello):
    _call("export", "--workspace", "acme", str(tmp_path))
    path = tmp_path / "hello-world.json"
    document = json.loads(path.read_text())
    document["definition"]["plan"][0]["config"]["output"]["message"] = "hello {{ inputs.who }}"
    path.write_text(json.dumps(document))
    out = _call("apply", str(tmp_path), "--workspace", "acme")
    assert "update     hello-world" in out
    assert '-            "message": "hi {{ inputs.who }}"' in out
    assert '+            "message": "hello {{ inputs.who }}"' in out
    hello.refresh_from_db()
    assert hello.version == 2
    applied = AuditEvent.objects.filter(type="automations.applied").count()
    again = _call("apply", str(tmp_path), "--workspace", "acme")
    assert "unchanged  hello-world" in again
    hello.refresh_from_db()
    assert hello.version == 2
    assert AuditEvent.objects.filter(type="automations.applied").count() == applied == 1
    row = AuditEvent.objects.get(type="automations.applied")
    assert row.payload["changes"] == [
        {"slug": "hello-world", "action": "update", "automation": str(hello.pk), "version": 2, "review": []}
    ]


def test_dry_run_writes_nothing(tmp_path, workspace):
    (tmp_path / "new.json").write_text(json.dumps({"definition": definition(name="New One")}))
    before = AuditEvent.objects.count()
    out = _call("apply", str(tmp_path), "--workspace", "acme", "--dry-run")
    assert "create     new-one" in out
    assert "dry run: nothing written" in out
    assert not Automation.objects.filter(workspace=workspace).exists()
    assert AuditEvent.objects.count() == before


def test_prune_archives_only_with_the_flag_and_never_with_runs_in_flight(tmp_path, workspace, hello, caller):
    _call("export", "--workspace", "acme", str(tmp_path))
    (tmp_path / "calls-crm.json").unlink()
    out = _call("apply", str(tmp_path), "--workspace", "acme")
    assert "archive    calls-crm" not in out
    assert "unchanged  calls-crm" not in out
    caller.refresh_from_db()
    assert caller.archived_at is None
    run = Run.objects.create(workspace=workspace, automation=caller, automation_version=1, trace_id="t" * 32,
                             queue="default", status=RunStatus.RUNNING)  # fmt: skip
    with pytest.raises(CommandError, match="runs in flight"):
        _call("apply", str(tmp_path), "--workspace", "acme", "--prune")
    caller.refresh_from_db()
    assert caller.archived_at is None
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    out = _call("apply", str(tmp_path), "--workspace", "acme", "--prune")
    assert "archive    calls-crm" in out
    assert "unchanged  hello-world" in out
    caller.refresh_from_db()
    assert caller.archived_at is not None


def test_a_file_that_does_not_validate_fails_the_whole_apply(tmp_path, workspace, hello):
    (tmp_path / "good.json").write_text(json.dumps({"definition": definition(name="Good")}))
    (tmp_path / "bad.json").write_text(json.dumps({"definition": definition(
        {"step_id": "x", "action": "no_such_action", "config": {}},
        crm_step("y", credential="does-not-exist"), name="Bad",
    )}))  # fmt: skip
    (tmp_path / "broken.yaml").write_text("definition: [unclosed")
    (tmp_path / "twin.json").write_text(json.dumps({"definition": definition(name="good")}))
    with pytest.raises(CommandError) as raised:
        _call("apply", str(tmp_path), "--workspace", "acme")
    message = str(raised.value)
    assert "nothing was applied" in message
    assert "bad.json: /definition/plan/0/action: unknown_action" in message
    assert "bad.json: /definition/plan/1/config/credential: unknown_credential" in message
    assert "broken.yaml: /: invalid_document" in message
    assert "twin.json: /slug: duplicate_slug" in message
    assert list(Automation.objects.filter(workspace=workspace)) == [hello]
    assert not AuditEvent.objects.filter(type="automations.applied").exists()


@pytest.mark.parametrize(
    "config",
    [
        {"method": "GET", "url": "http://127.0.0.1:9/", "headers": {"Authorization": "Bearer abcdef123456"}},
        {"method": "GET", "url": "http://127.0.0.1:9/?k=" + CREDENTIAL_VALUE},
        {"method": "GET", "url": "http://127.0.0.1:9/", "headers": {"X-Hook": "apt_" + "a" * 40}},
    ],
)
def test_a_secret_pasted_into_a_definition_is_refused(tmp_path, workspace, crm, config):
    step = {"step_id": "call", "action": "http_request", "config": config}
    (tmp_path / "leaky.json").write_text(json.dumps({"definition": definition(step, name="Leaky")}))
    with pytest.raises(CommandError, match="secret_in_definition"):
        _call("apply", str(tmp_path), "--workspace", "acme")
    assert not Automation.objects.filter(workspace=workspace).exists()


def test_a_risk_raising_apply_pauses_for_an_admins_review(tmp_path, workspace, hello, crm, owner, operator):
    _call("export", "--workspace", "acme", str(tmp_path))
    path = tmp_path / "hello-world.json"
    document = json.loads(path.read_text())
    document["definition"]["triggers"].append(
        {"key": "nightly", "type": "schedule", "config": {"cron": "0 3 * * *"}}
    )
    document["definition"]["plan"].append(crm_step("fetch"))
    document["definition"]["execution"]["autonomy"] = "A4"
    path.write_text(json.dumps(document))
    out = _call("apply", str(tmp_path), "--workspace", "acme")
    assert "paused for review" in out
    hello.refresh_from_db()
    assert (hello.status, hello.review_required, hello.version) == (AutomationStatus.PAUSED, True, 2)
    assert hello.review_reasons == ["uses credential 'crm'", "calls 'http_request'",
                                    "new schedule trigger 'nightly'", "autonomy A3 -> A4"]  # fmt: skip
    assert not Trigger.objects.get(automation=hello, key="nightly").enabled
    # applying the same files again leaves it paused and changes nothing
    assert "unchanged  hello-world" in _call("apply", str(tmp_path), "--workspace", "acme")
    # an operator can neither resume it nor activate it
    as_operator = client_for(operator)
    response = as_operator.patch(f"/api/v1/automations/{hello.pk}", {"status": "active"}, format="json")
    assert response.status_code == 409
    response = as_operator.post(f"/api/v1/automations/{hello.pk}/activate")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    hello.refresh_from_db()
    assert (hello.status, hello.review_required) == (AutomationStatus.PAUSED, True)
    # an admin activates it
    response = client_for(owner).post(f"/api/v1/automations/{hello.pk}/activate")
    assert response.status_code == 200
    assert (response.json()["status"], response.json()["review_required"]) == ("active", False)
    assert Trigger.objects.get(automation=hello, key="nightly").enabled
    assert AuditEvent.objects.filter(type="automation.review_activated").count() == 1


def test_a_lower_risk_apply_needs_no_review(tmp_path, workspace, caller):
    _call("export", "--workspace", "acme", str(tmp_path))
    path = tmp_path / "calls-crm.json"
    document = json.loads(path.read_text())
    document["definition"]["plan"] = [transform("only", {"ok": True})]
    path.write_text(json.dumps(document))
    _call("apply", str(tmp_path), "--workspace", "acme")
    caller.refresh_from_db()
    assert (caller.status, caller.review_required, caller.version) == ("active", False, 2)


def test_the_api_applies_and_answers_the_plan(workspace, hello, owner, operator, viewer):
    doc = client_for(owner).get(f"/api/v1/automations/{hello.pk}/export").json()
    new = {"definition": definition(name="From CI")}
    body = {"workspace": "acme", "automations": [doc, new], "dry_run": True}
    assert client_for(viewer).post("/api/v1/automations/apply", body, format="json").status_code == 403
    dry = client_for(operator).post("/api/v1/automations/apply", body, format="json")
    assert dry.status_code == 200, dry.content
    assert [(c["slug"], c["action"]) for c in dry.json()["changes"]] == [
        ("from-ci", "create"),
        ("hello-world", "unchanged"),
    ]
    assert not Automation.objects.filter(name="From CI").exists()
    real = client_for(operator).post("/api/v1/automations/apply", {**body, "dry_run": False}, format="json")
    assert real.status_code == 200
    assert set(real.json()) == set(dry.json())
    assert real.json()["counts"] == {"create": 1, "update": 0, "unchanged": 1, "archive": 0}
    created = Automation.objects.get(name="From CI")
    assert real.json()["changes"][0]["automation"] == str(created.pk)
    bad = client_for(operator).post("/api/v1/automations/apply", {"automations": [{"definition": {"name": "x"}}],
                                                                   "dry_run": False}, format="json")  # fmt: skip
    assert bad.status_code == 400
    assert all(e["file"] == "automations/0" for e in bad.json()["errors"])
    assert (
        client_for(operator)
        .post("/api/v1/automations/apply", {"automations": "no"}, format="json")
        .status_code
        == 400
    )


@pytest.mark.django_db(transaction=True)
def test_concurrent_applies_one_wins_the_other_sees_a_conflict(tmp_path, workspace):
    """While one apply holds the workspace (PostgreSQL row lock), another answers 409 at once."""
    if connection.vendor != "postgresql":
        pytest.skip(
            "SQLite serialises writers: the second apply waits for the first, then finds nothing to do"
        )
    held, release = threading.Event(), threading.Event()

    def first_apply_in_progress():
        try:
            with transaction.atomic():
                list(Workspace.objects.select_for_update(no_key=True).filter(pk=workspace.pk))
                held.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=first_apply_in_progress)
    thread.start()
    try:
        assert held.wait(10)
        source = as_code.Source(name="new.json", document={"definition": definition(name="New One")})
        with pytest.raises(as_code.ServiceError) as raised:
            as_code.apply_documents(workspace=workspace, sources=[source])
        assert raised.value.code == "CONFLICT"
        assert raised.value.http_status == 409
        assert not Automation.objects.filter(workspace=workspace).exists()
        # a dry run takes no lock: it still answers the plan
        plan = as_code.apply_documents(workspace=workspace, sources=[source], dry_run=True)
        assert plan["counts"]["create"] == 1
    finally:
        release.set()
        thread.join()
    plan = as_code.apply_documents(workspace=workspace, sources=[source])
    assert plan["counts"]["create"] == 1


def test_the_admin_action_activates_only_for_a_workspace_admin(tmp_path, workspace, hello, owner, operator):
    _call("export", "--workspace", "acme", str(tmp_path))
    path = tmp_path / "hello-world.json"
    document = json.loads(path.read_text())
    document["definition"]["triggers"].append(
        {"key": "nightly", "type": "schedule", "config": {"cron": "0 3 * * *"}}
    )
    path.write_text(json.dumps(document))
    _call("apply", str(tmp_path), "--workspace", "acme")

    def admin_client(user):
        user.is_staff = True
        user.save(update_fields=["is_staff"])
        user.user_permissions.add(*AuthPermission.objects.all())
        client = Client()
        client.force_login(user)
        return client

    changelist = reverse("admin:automations_automation_changelist")
    body = {"action": "activate_reviewed", ACTION_CHECKBOX_NAME: [str(hello.pk)]}
    page = admin_client(operator).post(changelist, body, follow=True).content.decode()
    assert "does not allow" in page
    hello.refresh_from_db()
    assert (hello.status, hello.review_required) == ("paused", True)
    # the change form refuses to resume it too
    change = reverse("admin:automations_automation_change", args=[hello.pk])
    response = admin_client(operator).post(
        change, {"definition": json.dumps(hello.definition), "status": "active"}
    )
    assert response.status_code == 200
    assert "Activate after review" in response.content.decode()
    hello.refresh_from_db()
    assert hello.status == "paused"
    page = admin_client(owner).post(changelist, body, follow=True).content.decode()
    assert "reviewed and activated" in page
    hello.refresh_from_db()
    assert (hello.status, hello.review_required) == ("active", False)


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"automations": [1]}, "/"),
        ({"automations": [{"definition": {}, "extra": 1}]}, "/extra"),
        ({"automations": [{"definition": definition(name="A"), "status": "running"}]}, "/status"),
        ({"automations": [{"definition": definition(name="A"), "slug": "b"}]}, "/slug"),
        ({"automations": [], "prune": "yes"}, None),
        ({"automations": [], "surprise": True}, None),
    ],
)
def test_hostile_apply_bodies_get_400_and_change_nothing(workspace, operator, body, path):
    client = client_for(operator)
    before = AuditEvent.objects.count()
    response = client.post("/api/v1/automations/apply", body, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    if path is not None:
        assert [(e["file"], e["path"] or "/") for e in errors][:1] == [("automations/0", path)]
    assert not Automation.objects.filter(workspace=workspace).exists()
    assert AuditEvent.objects.count() == before
