"""What /healthz, /metrics and /api/schema/ give a stranger (issue 32): status only, a token
for metrics when one is set, and a schema generated once per process."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from config.schema_view import CachedSchemaView

TOKEN = "m3trics-t0ken-of-the-deployment"


@pytest.fixture
def private(settings):
    settings.AUTOPLANE_HEALTHZ_DETAILS = "private"
    settings.AUTOPLANE_METRICS_TOKEN = TOKEN


def _staff_client(*, staff: bool = True) -> Client:
    user = get_user_model().objects.create_user("ops", password="pw-ops-123456", is_staff=staff)
    client = Client()
    client.force_login(user)
    return client


def test_an_anonymous_health_check_says_its_status_only_with_the_same_status_code(db, private):
    anonymous = Client().get("/healthz")
    full = Client().get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert anonymous.json() == {"status": full.json()["status"]}
    assert anonymous.status_code == full.status_code  # 503 here: no workers; 200 when all is up
    assert set(full.json()) == {"status", "failing", "checks"}
    assert "queues" in full.json()["checks"]


@pytest.mark.parametrize("authorization", ["Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer "])
def test_a_wrong_token_gets_no_health_details_and_no_metrics(db, private, authorization):
    assert set(Client().get("/healthz", HTTP_AUTHORIZATION=authorization).json()) == {"status"}
    metrics = Client().get("/metrics", HTTP_AUTHORIZATION=authorization)
    assert metrics.status_code == 401
    assert metrics.json()["error"]["code"] == "UNAUTHENTICATED"
    assert metrics["WWW-Authenticate"] == "Bearer"
    assert b"autoplane_" not in metrics.content


def test_metrics_need_the_token_or_a_staff_session_once_a_token_is_set(db, private):
    assert Client().get("/metrics").status_code == 401
    assert _staff_client(staff=False).get("/metrics").status_code == 401
    with_token = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert with_token.status_code == 200
    assert b"autoplane_" in with_token.content


def test_a_staff_session_reads_the_whole_health_report(db, private):
    assert "checks" in _staff_client().get("/healthz").json()


def test_without_a_token_metrics_stay_open_and_public_details_stay_public(db, settings):
    settings.AUTOPLANE_METRICS_TOKEN = ""
    settings.AUTOPLANE_HEALTHZ_DETAILS = "public"
    assert Client().get("/metrics").status_code == 200
    assert "checks" in Client().get("/healthz").json()


def test_the_schema_is_generated_once_per_process_whatever_the_query(db, monkeypatch):
    client = Client()
    first = client.get("/api/schema/")
    calls = []
    generator = CachedSchemaView.generator_class
    monkeypatch.setattr(generator, "get_schema", lambda *a, **k: calls.append(1) or {})

    again = [client.get("/api/schema/", {"version": f"v{n}", "lang": f"x{n}"}) for n in range(5)]

    assert calls == []
    assert first.status_code == 200
    assert all(r.content == first.content for r in again)


def _deploy_ids() -> set[str]:
    from django.core import checks

    return {
        m.id
        for m in checks.run_checks(include_deployment_checks=True)
        if m.id and m.id.startswith("autoplane.")
    }


@pytest.mark.django_db  # check --deploy also reads the workspaces (workspaces.W001)
def test_check_deploy_flags_open_metrics_public_health_and_a_proxy_without_hops(settings):
    settings.AUTOPLANE_METRICS_TOKEN = ""
    settings.AUTOPLANE_HEALTHZ_DETAILS = "public"
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.AUTOPLANE_TRUSTED_PROXY_HOPS = 0
    settings.AUTOPLANE_BODY_READ_TIMEOUT_SECONDS = 300
    assert _deploy_ids() >= {"autoplane.W001", "autoplane.W003", "autoplane.W004", "autoplane.W005"}

    settings.AUTOPLANE_METRICS_TOKEN = "short"
    assert "autoplane.W002" in _deploy_ids()


@pytest.mark.django_db  # check --deploy also reads the workspaces (workspaces.W001)
def test_check_deploy_is_quiet_about_the_edge_when_it_is_closed(settings):
    settings.AUTOPLANE_METRICS_TOKEN = TOKEN + "-and-long-enough"
    settings.AUTOPLANE_HEALTHZ_DETAILS = "private"
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.AUTOPLANE_TRUSTED_PROXY_HOPS = 1
    assert _deploy_ids() == set()


@pytest.mark.django_db  # check --deploy also reads the workspaces (workspaces.W001)
def test_doctor_flags_open_metrics_and_proxy_hops_with_a_production_database(settings):
    from ops.doctor import check_settings

    settings.DATABASE_IS_SQLITE = False
    settings.AUTOPLANE_METRICS_TOKEN = ""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    settings.AUTOPLANE_TRUSTED_PROXY_HOPS = 0
    findings = {f.check: f for f in check_settings()}
    assert findings["settings.autoplane.W001"].status == "warn"
    assert "AUTOPLANE_METRICS_TOKEN" in findings["settings.autoplane.W001"].fix
    assert findings["settings.autoplane.W004"].status == "warn"
