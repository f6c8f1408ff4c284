"""The API contract (issue 16): the OpenAPI description tells the truth, errors have one
style, /api/v1/ is an index, /api/docs/ needs no internet.

The live check of the same contract is schemathesis against a running platform
(``.ci/api-contract``); these tests pin the parts a client reads first.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
import yaml
from django.contrib.staticfiles import finders
from rest_framework.test import APIClient

from automations import services
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

ERROR_REF = "#/components/schemas/Error"


@pytest.fixture
def schema(client):
    response = client.get("/api/schema/")
    assert response.status_code == 200
    return yaml.safe_load(response.content)


def _operations(schema):
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def _json_schema(operation, status):
    return operation["responses"][status]["content"]["application/json"]["schema"]


def test_the_error_envelope_is_one_component_every_error_references(schema):
    error = schema["components"]["schemas"]["Error"]
    shapes = [ref["$ref"].rsplit("/", 1)[1] for ref in error["oneOf"]]
    assert sorted(shapes) == ["ErrorEnvelope", "ValidationErrorEnvelope"]
    envelope = schema["components"]["schemas"]["ErrorEnvelope"]
    assert envelope["required"] == ["error"]
    error_statuses = 0
    for path, method, operation in _operations(schema):
        for status in operation["responses"]:
            if status == "414":  # the web server's own answer, before the application
                assert list(operation["responses"][status]["content"]) == ["text/plain", "text/html"]
            elif status >= "400":
                assert _json_schema(operation, status) == {"$ref": ERROR_REF}, (method, path, status)
                error_statuses += 1
    assert error_statuses > 100


def test_every_operation_lists_the_errors_its_route_implies(schema):
    for path, method, operation in _operations(schema):
        statuses = set(operation["responses"])
        public = {} in operation.get("security", [{}])
        if "{" in path:
            assert "404" in statuses, (method, path)
        if not public:
            assert "401" in statuses, (method, path)
            signed_in = any("tokenAuth" in requirement for requirement in operation["security"])
            if signed_in and method != "get":
                assert "403" in statuses, (method, path)
        if method in {"post", "put", "patch"}:
            assert {"400", "413", "415"} <= statuses, (method, path)


def test_response_shapes_are_typed(schema):
    components = schema["components"]["schemas"]
    assert components["RunOut"]["properties"]["steps"] == {
        "type": "array", "items": {"$ref": "#/components/schemas/StepOut"}, "readOnly": True,
    }  # fmt: skip
    assert components["TriggerOut"]["properties"]["next_fire_at"]["nullable"] is True
    assert components["StepOut"]["properties"]["error"]["nullable"] is True
    assert components["StepOut"]["properties"]["duration_ms"]["nullable"] is True
    paths = schema["paths"]
    run = paths["/api/v1/automations/{id}/run"]["post"]
    rerun = paths["/api/v1/runs/{id}/rerun"]["post"]
    for operation in (run, rerun):
        assert _json_schema(operation, "202") == {"$ref": "#/components/schemas/RunAccepted"}
    assert set(components["RunAccepted"]["properties"]) >= {"run_id", "status_url", "status"}
    actions = _json_schema(paths["/api/v1/actions"]["get"], "200")
    capabilities = _json_schema(paths["/api/v1/capabilities"]["get"], "200")
    assert actions == {"$ref": "#/components/schemas/ActionPage"}
    assert capabilities == {"$ref": "#/components/schemas/CapabilityPage"}


def test_fire_declares_its_bearer_webhook_token(schema):
    fire = schema["paths"]["/api/v1/automations/{automation_id}/fire"]["post"]
    assert fire["security"] == [{"webhookToken": []}]
    assert schema["components"]["securitySchemes"]["webhookToken"] == {
        "type": "http", "scheme": "bearer",
        "description": "The trigger's webhook token (POST /triggers/{id}/rotate-token).",
    }  # fmt: skip
    assert {"200", "202", "400", "401", "404", "409", "413", "415", "422", "429"} <= set(fire["responses"])


def test_the_api_declares_its_token_or_a_session(schema):
    # Without the hashed tokens' scheme, clients (and schemathesis) read a session cookie as required.
    assert schema["paths"]["/api/v1/runs"]["get"]["security"] == [{"tokenAuth": []}, {"cookieAuth": []}]
    assert schema["components"]["securitySchemes"]["tokenAuth"] == {
        "type": "apiKey", "in": "header", "name": "Authorization",
        "description": 'Token-based authentication with required prefix "Token"',
    }  # fmt: skip


# --- one error style ------------------------------------------------------------------


def test_every_404_says_the_same(api):
    missing = uuid.uuid4()
    bodies = {
        "object not in your workspaces": api.get(f"/api/v1/automations/{missing}"),
        "route that does not exist": api.get("/api/v1/no-such-thing"),
        "id the route does not accept": api.get("/api/v1/automations/not-a-uuid"),
        "object via a generic view": api.get("/api/v1/credentials/987654"),
    }
    for label, response in bodies.items():
        assert response.status_code == 404, label
        assert response.content == b'{"error":{"code":"NOT_FOUND","message":"not found"}}', label


def test_every_401_is_formatted_alike():
    client = APIClient()
    no_token = client.get("/api/v1/automations")
    client.credentials(HTTP_AUTHORIZATION="Token nope")
    bad_token = client.get("/api/v1/automations")
    fire = APIClient().post(f"/api/v1/automations/{uuid.uuid4()}/fire", {}, format="json")
    for response in (no_token, bad_token, fire):
        assert response.status_code == 401
        assert response["Content-Type"] == "application/json"
        body = json.loads(response.content)
        assert set(body) == {"error"}
        assert body["error"]["code"]
        assert response.content == json.dumps(body, separators=(",", ":")).encode()


def test_run_and_rerun_answer_alike(workspace, api, drive):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("a", 1)), user=None
    )
    ran = api.post(f"/api/v1/automations/{automation.pk}/run", {}, format="json")
    assert ran.status_code == 202
    original = drive(ran.json()["run_id"])
    rerun = api.post(f"/api/v1/runs/{original.pk}/rerun", {}, format="json")
    assert rerun.status_code == 202
    assert set(rerun.json()) == set(ran.json()) == {"run_id", "status_url", "status"}
    assert rerun.json()["status"] == "queued"
    assert rerun.json()["status_url"] == f"/api/v1/runs/{rerun.json()['run_id']}"


# --- the index and the docs -------------------------------------------------------------


def test_api_root_is_an_index_of_resources_with_links_to_the_docs(client):
    response = client.get("/api/v1/")
    assert response.status_code == 200
    body = response.json()
    assert body["docs"] == "http://testserver/api/docs/"
    assert body["schema"] == "http://testserver/api/schema/"
    resources = body["resources"]
    for name in ("automations", "runs", "approvals", "audit", "capabilities", "actions", "events"):
        assert resources[name] == f"http://testserver/api/v1/{name}"
    assert not any("<" in route for route in resources)
    assert client.get(body["docs"]).status_code == 200


def test_api_docs_page_references_no_external_host(client):
    response = client.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert not re.search(r"(?:https?:)?//(?!testserver\b)[\w.-]+\.[a-z]", html, re.IGNORECASE)
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    for asset in assets:
        assert asset.startswith("/static/"), asset
        assert finders.find(asset.removeprefix("/static/")), f"{asset} is not served locally"


def test_run_filters_are_validated(api):
    assert api.get("/api/v1/runs?status=").status_code == 200  # blank: no filter, as documented
    assert api.get("/api/v1/runs?status=succeeded").status_code == 200
    for query in ("status=bogus", "automation=", "automation=not-an-id"):
        response = api.get(f"/api/v1/runs?{query}")
        assert response.status_code == 400, query
        assert response.json()["errors"][0]["path"] in {"/status", "/automation"}, query


@pytest.mark.parametrize("method", ["put", "delete"])
def test_an_undeclared_method_on_drafts_is_405_even_without_an_llm(api, settings, method):
    settings.LLM_BASE_URL = ""
    response = getattr(api, method)(f"/api/v1/drafts/{uuid.uuid4()}")
    assert response.status_code == 405
    assert response.json()["error"]["code"] == "METHOD_NOT_ALLOWED"


def test_a_page_that_is_not_a_number_is_400_and_one_past_the_end_404(api):
    assert api.get("/api/v1/automations?page=1").status_code == 200
    for page in ("", "abc", "0", "-1", "1.5"):
        response = api.get(f"/api/v1/automations?page={page}")
        assert response.status_code == 400, page
        assert response.json()["errors"][0]["path"] == "/page"
    past = api.get("/api/v1/automations?page=2")
    assert past.status_code == 404
    assert past.json()["error"]["message"] == "page 2 does not exist"
