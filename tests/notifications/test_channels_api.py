"""The channels API: admins manage a workspace's channels; URLs go through the egress guard at save."""

from __future__ import annotations

import pytest

from audit.models import AuditEvent
from notifications.models import Channel
from tests.factories import client_for

BASE = "/api/v1/workspaces/acme/channels"


def test_admin_adds_an_email_channel_with_a_flat_body(api, people):
    response = api.post(BASE, {"kind": "email", "name": "approvers", "to": ["role:approver", "ops@acme.example"]},
                        format="json")  # fmt: skip

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["kind"], body["name"], body["to"]) == (
        "email",
        "approvers",
        ["role:approver", "ops@acme.example"],
    )
    assert body["failing"] is False
    assert "secret" not in body
    listed = api.get(BASE).json()
    assert [c["name"] for c in listed] == ["approvers"]
    assert AuditEvent.objects.filter(type="notification.channel.created").count() == 1


def test_webhook_channel_secret_is_shown_once_and_stored_encrypted(api, people, receiver):
    response = api.post(
        BASE, {"kind": "webhook", "name": "hooks", "url": receiver.url("/hook")}, format="json"
    )

    assert response.status_code == 201, response.content
    secret = response.json()["secret"]
    assert secret.startswith("whsec_")
    channel = Channel.objects.get()
    assert secret not in channel.secret_encrypted
    assert "secret" not in api.get(f"{BASE}/{channel.pk}").json()
    assert all(secret not in str(e.payload) for e in AuditEvent.objects.all())


def test_slack_url_is_stored_encrypted_and_only_its_host_shown(api, people):
    url = "https://hooks.slack.com/services/T000/B000/XXXXSECRET"
    response = api.post(BASE, {"kind": "slack", "name": "slack", "url": url}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["url"] == "https://hooks.slack.com/…"
    channel = Channel.objects.get()
    assert "XXXXSECRET" not in channel.secret_encrypted + channel.url
    assert "XXXXSECRET" not in api.get(BASE).content.decode()


@pytest.mark.parametrize(
    "url",
    ["http://10.0.0.5/hook", "http://169.254.169.254/latest/meta-data", "http://[::ffff:192.168.1.1]/x"],
)
def test_a_channel_url_on_a_private_address_is_refused(api, people, url):
    response = api.post(BASE, {"kind": "webhook", "name": "internal", "url": url}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "POLICY_VIOLATION"
    assert not Channel.objects.exists()


@pytest.mark.parametrize(
    ("body", "path"),
    [
        ({"kind": "pager", "name": "x"}, "/kind"),
        ({"kind": "email", "name": "x", "to": ["not an address"]}, "/to/0"),
        ({"kind": "email", "name": "x", "to": ["role:viewer"]}, "/to/0"),
        ({"kind": "email", "name": "x", "to": []}, "/to"),
        ({"kind": "email", "name": "x", "to": "a@b.example"}, "/to"),
        ({"kind": "webhook", "name": "x"}, "/url"),
        ({"kind": "webhook", "name": "x", "url": "ftp://example.com/x"}, None),
        ({"kind": "email", "name": "", "to": ["a@b.example"]}, "/name"),
        ({"kind": "email", "name": "x", "to": ["a@b.example"], "bogus": 1}, "/bogus"),
    ],
)
def test_malformed_channels_are_refused_and_nothing_is_made(api, people, body, path):
    response = api.post(BASE, body, format="json")

    assert 400 <= response.status_code < 500
    payload = response.json()
    if path is not None:
        assert payload["errors"][0]["path"] == path
    assert not Channel.objects.exists()


def test_only_admins_manage_channels(api, people, receiver):
    made = api.post(BASE, {"kind": "email", "name": "a", "to": ["a@b.example"]}, format="json").json()
    for user in (people.alice, people.operator, people.viewer):
        client = client_for(user)
        created = client.post(BASE, {"kind": "email", "name": "b", "to": ["a@b.example"]}, format="json")
        assert created.status_code == 403
        assert created.json()["error"]["code"] == "PERMISSION_DENIED"
        assert client.patch(f"{BASE}/{made['id']}", {"name": "c"}, format="json").status_code == 403
        assert client.delete(f"{BASE}/{made['id']}").status_code == 403
        assert client.get(BASE).status_code == 200  # members see the channels
    assert client_for(people.outsider).get(BASE).status_code == 404
    assert list(Channel.objects.values_list("name", flat=True)) == ["a"]


def test_admin_changes_and_removes_a_channel(api, people, receiver):
    made = api.post(BASE, {"kind": "webhook", "name": "w", "url": receiver.url("/w")}, format="json").json()

    changed = api.patch(f"{BASE}/{made['id']}", {"name": "w2", "enabled": False}, format="json")
    assert changed.status_code == 200
    assert (changed.json()["name"], changed.json()["enabled"]) == ("w2", False)
    refused = api.patch(f"{BASE}/{made['id']}", {"url": "http://192.168.0.1/"}, format="json")
    assert refused.status_code == 400
    assert Channel.objects.get().url == receiver.url("/w")
    assert api.patch(f"{BASE}/{made['id']}", {"kind": "email"}, format="json").status_code == 400
    assert api.delete(f"{BASE}/{made['id']}").status_code == 204
    assert not Channel.objects.exists()


def test_channel_names_are_unique_per_workspace(api, people):
    body = {"kind": "email", "name": "same", "to": ["a@b.example"]}
    assert api.post(BASE, body, format="json").status_code == 201
    again = api.post(BASE, body, format="json")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "CONFLICT"
