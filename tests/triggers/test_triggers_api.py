"""Trigger rows follow the definition; the trigger API and admin manage webhook credentials."""

from __future__ import annotations

import json

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from rest_framework.test import APIClient

from audit.models import AuditEvent
from automations import services
from tests.factories import client_for, definition, event, fire, schedule, webhook
from triggers.models import Trigger
from triggers.services import token_hash, trigger_token_rotate

# --- sync --------------------------------------------------------------------------------------


def test_triggers_keep_their_identity_and_token_per_key_across_edits(db, make_automation, owner):
    automation = make_automation(definition(triggers=[webhook(), schedule(), event()]))
    before = {t.key: t for t in automation.triggers.all()}
    token = trigger_token_rotate(trigger=before["hook"], user=owner)

    services.automation_update(automation=automation, user=owner, definition=definition(
        name="renamed", triggers=[webhook(input_mapping={"a": "$.a"}), event(event_type="files.removed")]))  # fmt: skip

    after = {t.key: t for t in automation.triggers.all()}
    assert set(after) == {"hook", "on-event"}
    assert after["hook"].pk == before["hook"].pk
    assert after["hook"].config == {"input_mapping": {"a": "$.a"}}
    assert after["hook"].token_hash == token_hash(token)
    assert after["on-event"].pk == before["on-event"].pk
    assert after["on-event"].event_type == "files.removed"
    assert fire(APIClient(), automation.pk, {"a": 1}, token=token).status_code == 202


def test_a_key_whose_type_changes_is_a_new_trigger_and_the_old_token_dies(db, make_automation, owner):
    automation = make_automation(definition(triggers=[webhook(key="k")]))
    old = automation.triggers.get()
    token = trigger_token_rotate(trigger=old, user=owner)

    services.automation_update(automation=automation, user=owner,
                               definition=definition(triggers=[schedule(key="k")]))  # fmt: skip

    new = automation.triggers.get()
    assert new.pk != old.pk
    assert new.type == "schedule"
    assert fire(APIClient(), automation.pk, {}, token=token).status_code == 401


def test_enabled_false_and_pausing_disable_triggers(db, make_automation, owner):
    automation = make_automation(definition(triggers=[webhook(), {**event(), "enabled": False}]))
    assert {t.key: t.enabled for t in automation.triggers.all()} == {"hook": True, "on-event": False}

    services.automation_update(automation=automation, status="paused", user=owner)
    assert not automation.triggers.filter(enabled=True).exists()

    services.automation_update(automation=automation, status="active", user=owner)
    assert {t.key: t.enabled for t in automation.triggers.all()} == {"hook": True, "on-event": False}
    assert AuditEvent.objects.filter(type="trigger.disabled").count() == 1


def test_a_new_webhook_trigger_has_no_token_until_one_is_rotated_in(db, make_automation):
    automation = make_automation(definition(triggers=[webhook()]))

    trigger = automation.triggers.get()

    assert trigger.token_hash is None
    assert fire(APIClient(), automation.pk, {}, token="apt_anything").status_code == 401


# --- API ---------------------------------------------------------------------------------------------


def test_the_trigger_list_shows_each_trigger_with_its_next_fire(db, make_automation, api, viewer, outsider):
    automation = make_automation(definition(triggers=[schedule(cron="0 9 * * *", timezone="Europe/Berlin"),
                                                      webhook()]))  # fmt: skip

    response = client_for(viewer).get(f"/api/v1/automations/{automation.pk}/triggers")

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    by_key = {item["key"]: item for item in body["results"]}
    for item in by_key.values():
        assert {"id", "key", "type", "config", "enabled", "last_fired_at", "next_fire_at"} <= set(item)
    assert by_key["cron"]["next_fire_at"] is not None
    assert by_key["cron"]["config"] == {"cron": "0 9 * * *", "timezone": "Europe/Berlin"}
    assert by_key["hook"]["next_fire_at"] is None
    assert by_key["hook"]["has_token"] is False
    assert "token_hash" not in by_key["hook"]
    assert client_for(outsider).get(f"/api/v1/automations/{automation.pk}/triggers").status_code == 404
    assert APIClient().get(f"/api/v1/automations/{automation.pk}/triggers").status_code == 401


def test_rotating_a_token_shows_it_once_and_needs_the_admin_role(db, make_automation, owner, operator, viewer,
                                                                  outsider):  # fmt: skip
    automation = make_automation(definition(triggers=[webhook(), schedule()]))
    hook = automation.triggers.get(key="hook")
    cron = automation.triggers.get(key="cron")

    response = client_for(owner).post(f"/api/v1/triggers/{hook.pk}/rotate-token")

    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    token = response.json()["token"]
    assert token.startswith("apt_")
    assert len(token) > 40
    assert Trigger.objects.get(pk=hook.pk).token_hash == token_hash(token)
    rotated = AuditEvent.objects.get(type="trigger.token_rotated")
    assert token not in json.dumps([rotated.summary, rotated.payload, rotated.refs])
    for who in (operator, viewer):
        denied = client_for(who).post(f"/api/v1/triggers/{hook.pk}/rotate-token")
        assert denied.status_code == 403
        assert denied.json()["error"]["code"] == "PERMISSION_DENIED"
        assert client_for(who).post(f"/api/v1/triggers/{hook.pk}/rotate-signing-secret").status_code == 403
    assert client_for(outsider).post(f"/api/v1/triggers/{hook.pk}/rotate-token").status_code == 404
    assert Trigger.objects.get(pk=hook.pk).token_hash == token_hash(token)  # the refusals changed nothing
    assert AuditEvent.objects.filter(type="trigger.token_rotated").count() == 1
    refused = client_for(owner).post(f"/api/v1/triggers/{cron.pk}/rotate-token")
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert fire(APIClient(), automation.pk, {}, token=token).status_code == 202


def test_an_operator_revokes_a_token_and_fires_get_401(db, make_automation, api, operator, viewer):
    automation = make_automation(definition(triggers=[webhook()]))
    hook = automation.triggers.get()
    token = api.post(f"/api/v1/triggers/{hook.pk}/rotate-token").json()["token"]

    assert client_for(viewer).post(f"/api/v1/triggers/{hook.pk}/revoke-token").status_code == 403
    response = client_for(operator).post(f"/api/v1/triggers/{hook.pk}/revoke-token")

    assert response.status_code == 200
    assert response.json()["has_token"] is False
    assert response.json()["token_revoked_at"] is not None
    assert fire(APIClient(), automation.pk, {}, token=token).status_code == 401


def test_a_signing_secret_is_shown_once_and_stored_encrypted(db, make_automation, api):
    automation = make_automation(definition(triggers=[webhook(require_signature=True)]))
    hook = automation.triggers.get()

    response = api.post(f"/api/v1/triggers/{hook.pk}/rotate-signing-secret")

    assert response.status_code == 200
    secret = response.json()["signing_secret"]
    assert secret.startswith("whsec_")
    stored = Trigger.objects.get(pk=hook.pk)
    assert stored.signing_secret_encrypted
    assert secret not in stored.signing_secret_encrypted
    for audit_event in AuditEvent.objects.all():
        assert secret.removeprefix("whsec_") not in json.dumps(audit_event.payload)


# --- admin ----------------------------------------------------------------------------------------------


def test_the_admin_rotate_action_shows_the_token_once(db, make_automation, workspace):
    automation = make_automation(definition(triggers=[webhook()]))
    hook = automation.triggers.get()
    admin_user = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client = APIClient()
    client.force_login(admin_user)

    response = client.post(
        "/admin/triggers/trigger/",
        {"action": "rotate_token", "_selected_action": [str(hook.pk)]},
        format="multipart",
        follow=True,
    )  # fmt: skip  (an HTML form)

    assert response.status_code == 200
    stored = Trigger.objects.get(pk=hook.pk)
    messages = [str(m) for m in response.context["messages"]]
    (shown,) = [m for m in messages if "apt_" in m]
    token = shown[shown.index("apt_") :].split()[0]
    assert stored.token_hash == token_hash(token)
    listing = client.get("/admin/triggers/trigger/")
    assert listing.status_code == 200
    assert token not in listing.content.decode()


def test_a_removed_trigger_is_audited_under_its_id(db, make_automation, owner):
    automation = make_automation(definition(triggers=[webhook()]))
    trigger_id = str(automation.triggers.get().pk)

    services.automation_update(automation=automation, user=owner, definition=definition())

    assert AuditEvent.objects.get(type="trigger.deleted").refs["trigger"] == trigger_id


def _staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(content_type__app_label="triggers"))
    client = Client()
    client.force_login(user)
    return client


def test_the_rotate_actions_are_an_admins_not_an_operators(db, make_automation, owner, operator):
    automation = make_automation(definition(triggers=[webhook()]))
    hook = automation.triggers.get()
    changelist = "/admin/triggers/trigger/"
    as_operator, as_owner = _staff(operator), _staff(owner)

    offered = as_operator.get(changelist).content.decode()
    posted = {
        action: as_operator.post(changelist, {"action": action, "_selected_action": [str(hook.pk)]})
        for action in ("rotate_token", "rotate_signing_secret")
    }
    revoked = as_operator.post(changelist, {"action": "revoke_token", "_selected_action": [str(hook.pk)]})

    assert 'value="revoke_token"' in offered
    assert 'value="rotate_token"' not in offered
    assert 'value="rotate_signing_secret"' not in offered
    assert {action: r.status_code for action, r in posted.items()} == {"rotate_token": 403,
                                                                       "rotate_signing_secret": 403}  # fmt: skip
    assert revoked.status_code == 302
    stored = Trigger.objects.get(pk=hook.pk)
    assert not stored.token_hash
    assert not stored.signing_secret_encrypted
    assert not AuditEvent.objects.filter(type__in=["trigger.token_rotated", "trigger.signing_secret_rotated"])
    assert 'value="rotate_token"' in as_owner.get(changelist).content.decode()
    rotated = as_owner.post(changelist, {"action": "rotate_token", "_selected_action": [str(hook.pk)]})
    assert rotated.status_code == 302
    assert Trigger.objects.get(pk=hook.pk).token_hash
    assert AuditEvent.objects.get(type="trigger.token_rotated").actor == "user:owner"


def test_the_trigger_admin_shows_only_the_users_workspaces(db, make_automation, outsider):
    automation = make_automation(definition(triggers=[webhook()]))
    hook = automation.triggers.get()

    page = _staff(outsider).get("/admin/triggers/trigger/").content.decode()
    acted = _staff(outsider).post("/admin/triggers/trigger/",
                                  {"action": "revoke_token", "_selected_action": [str(hook.pk)]})  # fmt: skip

    assert str(hook.pk) not in page
    assert acted.status_code in (200, 302)  # nothing selected that they can see
    assert not AuditEvent.objects.filter(type="trigger.token_revoked").exists()
