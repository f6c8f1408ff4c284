"""GET /api/v1/audit, /audit/{id}, /audit/verify and /keys."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from audit import signing, writer
from audit.models import AuditEvent

pytestmark = pytest.mark.django_db


def _client(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def test_a_token_from_workspace_a_sees_none_of_workspace_b(api_users):
    # given events in both workspaces and on the platform chain
    writer.append(trace_id="ta", type="test.a", summary="in A", workspace_id=api_users.ws_a.id)
    b_event = writer.append(trace_id="tb", type="test.b", summary="in B", workspace_id=api_users.ws_b.id)
    writer.append(trace_id="tp", type="test.platform", summary="platform")
    # when Alice (workspace A) lists the ledger
    body = _client(api_users.alice).get("/api/v1/audit").json()
    # then she sees only workspace A's events
    assert set(body) == {"next", "previous", "results"}
    assert len(body["results"]) == AuditEvent.objects.filter(workspace_id=api_users.ws_a.id).count()
    assert {e["chain"] for e in body["results"]} == {f"ws-{api_users.ws_a.id}"}
    assert _client(api_users.alice).get("/api/v1/audit", {"trace_id": "tb"}).json()["results"] == []
    # and B's event is not found for her, but is for Bob
    assert _client(api_users.alice).get(f"/api/v1/audit/{b_event.id}").status_code == 404
    assert _client(api_users.bob).get(f"/api/v1/audit/{b_event.id}").json()["summary"] == "in B"
    # and someone in no workspace sees nothing
    assert _client(api_users.olga).get("/api/v1/audit").json()["results"] == []


def test_a_trace_comes_back_in_order_with_every_field(api_users):
    ws = api_users.ws_a.id
    for i in range(5):
        writer.append(
            trace_id="trace-1", type=f"step.{i}", summary=f"step {i}", workspace_id=ws, refs={"run": 41}
        )
        writer.append(trace_id="other", type="noise", summary="noise", workspace_id=ws)
    body = _client(api_users.alice).get("/api/v1/audit", {"trace_id": "trace-1"}).json()
    assert [e["type"] for e in body["results"]] == [f"step.{i}" for i in range(5)]
    ids = [e["id"] for e in body["results"]]
    assert ids == sorted(ids)
    first = body["results"][0]
    expected = {
        "id", "timestamp", "trace_id", "stage", "type", "summary", "outcome", "refs", "actor",
        "payload", "hash", "prev_hash", "seq", "chain",
    }  # fmt: skip
    assert expected <= set(first)
    stored = AuditEvent.objects.get(pk=first["id"])
    assert (first["hash"], first["prev_hash"], first["seq"]) == (stored.hash, stored.prev_hash, stored.seq)


def test_filters_by_type_and_run(api_users):
    ws = api_users.ws_a.id
    writer.append(trace_id="t", type="run.created", summary="r1", workspace_id=ws, refs={"run": 7})
    writer.append(trace_id="t", type="run.created", summary="r2", workspace_id=ws, refs={"run": "8"})
    writer.append(trace_id="t", type="step.succeeded", summary="s", workspace_id=ws, refs={"run": 7})
    client = _client(api_users.alice)
    assert [e["summary"] for e in client.get("/api/v1/audit", {"type": "run.created"}).json()["results"]] == [
        "r1",
        "r2",
    ]
    assert [e["summary"] for e in client.get("/api/v1/audit", {"run": "7"}).json()["results"]] == ["r1", "s"]
    assert [e["summary"] for e in client.get("/api/v1/audit", {"run": "8"}).json()["results"]] == ["r2"]


def test_without_a_token_is_401():
    response = _client().get("/api/v1/audit")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "UNAUTHENTICATED"


def test_bad_query_parameter_is_400(api_users):
    response = _client(api_users.alice).get("/api/v1/audit", {"trace_id": "x" * 65})
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/trace_id"


def test_keys_are_public():
    response = _client().get("/api/v1/keys")
    assert response.status_code == 200
    (key,) = response.json()["keys"]
    assert key["key_id"] == signing.current_key_id()
    assert key["algorithm"] == "Ed25519"
    assert key["current"] is True


def test_verify_covers_only_the_callers_chains(api_users, tamper):
    # given one altered event in workspace B
    writer.append(trace_id="t", type="a", summary="a", workspace_id=api_users.ws_a.id)
    b_event = writer.append(trace_id="t", type="b", summary="b", workspace_id=api_users.ws_b.id)
    tamper.set_payload(b_event.id, {"forged": True})
    # then Alice's chains verify, Bob's do not and name the event
    alice = _client(api_users.alice).get("/api/v1/audit/verify").json()
    assert alice["ok"] is True
    assert alice["broken"] is None
    assert alice["events"] == AuditEvent.objects.filter(workspace_id=api_users.ws_a.id).count()
    bob = _client(api_users.bob).get("/api/v1/audit/verify").json()
    assert bob["ok"] is False
    assert bob["broken"]["event_id"] == b_event.id
    assert bob["broken"]["chain"] == f"ws-{api_users.ws_b.id}"
    assert _client(api_users.olga).get("/api/v1/audit/verify").json() == {
        "ok": True,
        "chains": 0,
        "events": 0,
        "checkpoints": 0,
        "broken": None,
        "verified_at": None,
        "full": False,
    }
