"""Channels in the admin: added through the same service as the API (egress guard, secret shown once)."""

from __future__ import annotations

from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client

from notifications.models import Channel

ADD = "/admin/notifications/channel/add/"


def _staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(content_type__app_label="notifications"))
    client = Client()
    client.force_login(user)
    return client


def test_an_admin_adds_a_webhook_channel_and_sees_its_secret_once(people, receiver):
    client = _staff(people.owner)

    response = client.post(ADD, {"workspace": people.workspace.pk, "kind": "webhook", "name": "pager",
                                 "url_text": receiver.url("/admin-hook"), "enabled": "on"}, follow=True)  # fmt: skip

    assert response.status_code == 200
    channel = Channel.objects.get()
    assert (channel.kind, channel.url) == ("webhook", receiver.url("/admin-hook"))
    shown = [str(m) for m in response.context["messages"]]
    assert any("whsec_" in m for m in shown)
    assert "whsec_" not in client.get(f"/admin/notifications/channel/{channel.pk}/change/").content.decode()


def test_the_admin_refuses_a_private_url_and_non_admins(people):
    client = _staff(people.owner)
    response = client.post(ADD, {"workspace": people.workspace.pk, "kind": "webhook", "name": "internal",
                                 "url_text": "http://10.1.2.3/x", "enabled": "on"})  # fmt: skip
    assert response.status_code == 200  # the form again, with the error
    assert "private or reserved" in response.content.decode()
    assert not Channel.objects.exists()

    approver = _staff(people.alice)
    refused = approver.post(ADD, {"workspace": people.workspace.pk, "kind": "email", "name": "m",
                                  "to_text": "a@b.example", "enabled": "on"})  # fmt: skip
    assert refused.status_code in (200, 403)
    assert not Channel.objects.exists()


def test_delete_selected_is_an_admins_and_audited(people, receiver):
    from audit.models import AuditEvent
    from notifications.services import channel_create

    channel, _ = channel_create(workspace=people.workspace, user=people.owner, kind="webhook", name="w",
                                url=receiver.url("/del"))  # fmt: skip
    body = {"action": "delete_selected", "_selected_action": [channel.pk], "post": "yes"}

    _staff(people.alice).post("/admin/notifications/channel/", body)
    assert Channel.objects.filter(pk=channel.pk).exists()  # an approver may not

    _staff(people.owner).post("/admin/notifications/channel/", body)
    assert not Channel.objects.filter(pk=channel.pk).exists()
    assert AuditEvent.objects.filter(type="notification.channel.deleted", actor="user:owner").count() == 1
