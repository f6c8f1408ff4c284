"""The approvals REST API: scoping, shapes, decisions and their error codes, standing approvals, links."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import Approval, ApprovalStatus, StandingApproval
from tests.factories import definition, risk_step
from workspaces.models import Workspace


def _client(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def parked(drive, target, path_for):
    path = path_for("api")
    run = drive.start(drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2")))
    return SimpleNamespace(run=run, path=path, approval=drive.approval(run))


def test_pending_list_is_scoped_and_shaped(people, parked):
    response = _client(people.viewer).get("/api/v1/approvals", {"status": "pending"})

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    assert set(body) >= {"count", "next", "previous", "results"}
    item = body["results"][0]
    assert item["id"] == str(parked.approval.pk)
    assert item["run_id"] == str(parked.run.pk)
    assert item["step_id"] == "create_item"
    assert item["status"] == "pending"
    assert item["risk"] == "medium"
    assert item["what"] == parked.approval.what
    assert item["why"] == parked.approval.why
    assert item["requested_by"] == "user:operator"
    assert item["approvals_required"] == 1
    assert item["approvals_count"] == 0
    assert item["automation_id"] == str(parked.run.automation_id)
    assert item["automation_name"] == "test automation"
    assert {"expires_at", "created_at", "message"} <= set(item)
    assert "token" not in item
    assert "plan_hash" in item


def test_outsiders_see_nothing(people, parked):
    client = _client(people.outsider)

    assert client.get("/api/v1/approvals").json()["count"] == 0
    assert client.get(f"/api/v1/approvals/{parked.approval.pk}").status_code == 404
    response = client.post(f"/api/v1/approvals/{parked.approval.pk}/approve", {}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "NOT_FOUND"


def test_status_filter_is_validated(people, parked):
    response = _client(people.alice).get("/api/v1/approvals", {"status": "bogus"})

    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "/status"


def test_approve_then_the_run_completes(drive, people, target, parked):
    response = _client(people.alice).post(
        f"/api/v1/approvals/{parked.approval.pk}/approve", {}, format="json"
    )

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "approved"
    assert response.json()["approvals_count"] == 1
    assert drive.resume(parked.run).status == "succeeded"
    assert target.count(parked.path) == 1


def test_second_decision_is_409(people, parked):
    _client(people.alice).post(f"/api/v1/approvals/{parked.approval.pk}/approve", {}, format="json")

    response = _client(people.bob).post(
        f"/api/v1/approvals/{parked.approval.pk}/deny", {"reason": "x"}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "CONFLICT"


def test_deny_without_reason_is_400(people, parked):
    response = _client(people.alice).post(f"/api/v1/approvals/{parked.approval.pk}/deny", {}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert Approval.objects.get(pk=parked.approval.pk).status == ApprovalStatus.PENDING


def test_deny_with_reason(drive, people, parked):
    response = _client(people.alice).post(f"/api/v1/approvals/{parked.approval.pk}/deny", {"reason": "no"},
                                          format="json")  # fmt: skip

    assert response.status_code == 200
    assert response.json()["status"] == "denied"
    assert drive.resume(parked.run).error["code"] == "APPROVAL_DENIED"


@pytest.mark.parametrize("who", ["viewer", "operator"])
def test_members_without_the_approver_role_get_403(people, parked, who):
    response = _client(getattr(people, who)).post(f"/api/v1/approvals/{parked.approval.pk}/approve", {},
                                                  format="json")  # fmt: skip

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"


def test_four_eyes_triggering_user_gets_403(drive, people, target, path_for):
    Workspace.objects.filter(pk=people.workspace.pk).update(four_eyes=True)
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("4e"))), autonomy="A2")),
        user=people.owner,
    )

    response = _client(people.owner).post(
        f"/api/v1/approvals/{drive.approval(run).pk}/approve", {}, format="json"
    )

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "PERMISSION_DENIED"
    assert "four-eyes" in response.json()["error"]["message"]


def test_unauthenticated_is_refused(parked):
    response = APIClient().get("/api/v1/approvals")

    assert response.status_code in (401, 403)
    assert "error" in response.json()


def test_link_endpoint_returns_a_one_click_url_for_the_caller(people, parked):
    response = _client(people.alice).post(f"/api/v1/approvals/{parked.approval.pk}/link")

    assert response.status_code == 201
    url = response.json()["url"]
    path, _, token = url.partition("#")
    assert path == "http://localhost:8000/api/v1/approvals/link/"  # AUTOPLANE_PUBLIC_URL; no token in it
    page = APIClient().post("/api/v1/approvals/link/", {"token": token, "step": "review"}, format="multipart")
    assert page.status_code == 200
    assert "alice" in page.content.decode()


def test_link_endpoint_refuses_non_approvers(people, parked):
    response = _client(people.viewer).post(f"/api/v1/approvals/{parked.approval.pk}/link")

    assert response.status_code == 403


def test_standing_approvals_create_list_revoke(drive, people, target, path_for):
    path = path_for("standing-api")
    automation = drive.automation(definition(risk_step("medium", target.url(path)), autonomy="A2"))
    client = _client(people.alice)

    created = client.post("/api/v1/standing-approvals", {
        "automation_id": str(automation.pk), "capability_id": "http_request", "max_uses": 3,
        "expires_in_seconds": 3600, "arg_constraint": {"type": "object"}, "reason": "nightly cleanup",
    }, format="json")  # fmt: skip

    assert created.status_code == 201, created.content
    standing = created.json()
    assert standing["uses"] == 0
    assert standing["max_uses"] == 3
    assert standing["created_by"] == "alice"
    assert drive.start(automation).status == "succeeded"
    listed = client.get("/api/v1/standing-approvals").json()
    assert listed["count"] == 1
    assert listed["results"][0]["uses"] == 1
    assert _client(people.outsider).get("/api/v1/standing-approvals").json()["count"] == 0

    revoked = client.post(f"/api/v1/standing-approvals/{standing['id']}/revoke")
    assert revoked.status_code == 200
    assert revoked.json()["revoked"] is True
    assert client.post(f"/api/v1/standing-approvals/{standing['id']}/revoke").status_code == 409
    assert drive.start(automation).status == "awaiting_approval"


def test_standing_approval_create_errors(people):
    client = _client(people.alice)
    base = {
        "automation_id": "6b1f0c0e-1111-4111-8111-111111111111",
        "capability_id": "http_request",
        "max_uses": 1,
    }

    both = client.post("/api/v1/standing-approvals", {**base, "expires_in_seconds": 3600,
                                                      "expires_at": timezone.now().isoformat()}, format="json")  # fmt: skip
    bad_schema = client.post("/api/v1/standing-approvals", {**base, "expires_in_seconds": 3600,
                                                            "arg_constraint": {"type": 7}}, format="json")  # fmt: skip
    viewer = _client(people.viewer).post("/api/v1/standing-approvals", {**base, "expires_in_seconds": 3600,
                                                                      "workspace": "acme"}, format="json")  # fmt: skip
    past = client.post("/api/v1/standing-approvals",
                       {**base, "expires_at": (timezone.now() - timedelta(hours=1)).isoformat()}, format="json")  # fmt: skip

    assert both.status_code == 400
    assert "errors" in both.json()
    assert bad_schema.status_code == 400
    assert bad_schema.json()["error"]["code"] == "INVALID_ARGUMENT"
    assert viewer.status_code == 403
    assert viewer.json()["error"]["code"] == "PERMISSION_DENIED"
    assert past.status_code == 400
    assert not StandingApproval.objects.exists()
