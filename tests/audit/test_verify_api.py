"""GET /api/v1/audit/verify serves the last verification (with its time) instead of walking the
ledger per request; a full walk is for admins, once per interval (429 with Retry-After)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from audit import writer
from audit.checkpoints import checkpoint_write
from audit.models import AuditVerification
from audit.tasks import audit_verify

pytestmark = pytest.mark.django_db


def _client(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def _verify(token: str, **query):
    return _client(token).get("/api/v1/audit/verify", query)


def test_a_read_serves_the_stored_result_until_the_periodic_verification_runs(api_users, tamper):
    event = writer.append(trace_id="t", type="b", summary="b", workspace_id=api_users.ws_b.id)
    first = _verify(api_users.bob).json()
    assert (first["ok"], first["full"]) == (True, False)
    assert first["verified_at"] is not None

    tamper.set_payload(event.id, {"forged": True})
    again = _verify(api_users.bob).json()
    assert again == first  # served, not walked again

    audit_verify()  # the beat task
    after = _verify(api_users.bob).json()
    assert after["ok"] is False
    assert after["broken"]["event_id"] == event.id
    assert after["verified_at"] > first["verified_at"]


def test_a_stale_result_is_refreshed_on_read(api_users, tamper, settings):
    event = writer.append(trace_id="t", type="b", summary="b", workspace_id=api_users.ws_b.id)
    assert _verify(api_users.bob).json()["ok"] is True
    tamper.set_payload(event.id, {"forged": True})
    settings.AUTOPLANE_AUDIT_VERIFY_SECONDS = 0  # every stored result is now stale

    assert _verify(api_users.bob).json()["broken"]["event_id"] == event.id


@pytest.mark.parametrize("who", ["bob", "olga"])
def test_a_full_walk_is_refused_to_non_admins(api_users, who):
    writer.append(trace_id="t", type="b", summary="b", workspace_id=api_users.ws_b.id)

    response = _verify(getattr(api_users, who), full="true")

    assert response.status_code == 403, response.content
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert not AuditVerification.objects.filter(full_requested_at__isnull=False).exists()


def test_a_full_walk_is_rate_limited_per_interval(api_users, settings):
    settings.AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS = 600
    writer.append(trace_id="t", type="a", summary="a", workspace_id=api_users.ws_a.id)

    first = _verify(api_users.alice, full="true")
    assert first.status_code == 200, first.content
    assert (first.json()["ok"], first.json()["full"]) == (True, True)

    second = _verify(api_users.alice, full="true")
    assert second.status_code == 429, second.content
    assert second.json()["error"]["code"] == "RATE_LIMITED"
    assert 590 <= int(second["Retry-After"]) <= 600
    assert _verify(api_users.alice).status_code == 200  # the stored result is still served

    started = AuditVerification.objects.get().full_requested_at
    AuditVerification.objects.update(full_requested_at=started - timedelta(seconds=100))
    later = _verify(api_users.alice, full="true")
    assert later.status_code == 429
    assert 490 <= int(later["Retry-After"]) <= 500  # what is left of the interval

    AuditVerification.objects.update(full_requested_at=started - timedelta(seconds=601))
    assert _verify(api_users.alice, full="true").status_code == 200


def test_a_break_found_by_a_full_walk_is_not_cleared_by_an_incremental_one(api_users, tamper):
    ws = api_users.ws_a.id
    old = writer.append(trace_id="t", type="a", summary="old", workspace_id=ws)
    checkpoint_write(writer.chain_for(ws))
    writer.append(trace_id="t", type="a", summary="new", workspace_id=ws)
    tamper.set_payload(old.id, {"forged": True})  # below the newest checkpoint

    full = _verify(api_users.alice, full="true").json()
    assert full["broken"]["event_id"] == old.id

    audit_verify()  # from the checkpoint on: it does not see the altered row
    served = _verify(api_users.alice).json()
    assert served["ok"] is False
    assert served["broken"]["event_id"] == old.id


@pytest.mark.parametrize("full", ["maybe", ""])
def test_a_bad_query_is_a_400(api_users, full):
    response = _verify(api_users.alice, full=full)
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/full"


def test_the_admin_shows_a_non_superuser_the_last_verification_of_their_chains(workspace, viewer, tamper):
    from django.contrib.auth.models import Permission as AuthPermission
    from django.test import Client

    event = writer.append(trace_id="t", type="a", summary="a", workspace_id=workspace.id)
    writer.append(trace_id="t", type="other", summary="elsewhere", workspace_id=workspace.id + 1000)
    viewer.is_staff = True
    viewer.save(update_fields=["is_staff"])
    viewer.user_permissions.add(*AuthPermission.objects.filter(codename="view_auditevent"))
    client = Client()
    client.force_login(viewer)

    first = client.post("/admin/audit/auditevent/verify/", follow=True).content.decode()
    assert "ledger OK" in first
    assert "in 1 chain(s)" in first  # their one chain, not the other workspace's
    assert "the last incremental verification" in first

    tamper.set_payload(event.id, {"forged": True})
    assert (
        "ledger OK" in client.post("/admin/audit/auditevent/verify/", follow=True).content.decode()
    )  # served
    audit_verify()
    assert "ledger BROKEN" in client.post("/admin/audit/auditevent/verify/", follow=True).content.decode()
