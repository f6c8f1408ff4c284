"""Hostile bodies never get a 5xx, and the API speaks JSON only (issue 12 #5, issue 16).

One parametrised test sends every write endpoint of the API an oversized body, a deeply
nested one, lone surrogates, a multipart form and a gzip-encoded body, and asserts a clean
error envelope (413 / 400 / 415) or an accepted body that reads back: never a 5xx, never
HTML. The objects the paths name exist, so the bodies reach the views' parsing.
"""

from __future__ import annotations

import gzip
import json
import uuid

import pytest
from django.test import Client
from django.urls import get_resolver
from django.urls.resolvers import URLResolver

from automations import services as engine
from capabilities.credentials import credential_create
from capabilities.mcp import mcp_server_create
from tests.factories import client_for, member
from triggers.services import trigger_token_rotate
from workspaces.models import Role
from workspaces.services import workspace_get_or_create

BIG = b'{"payload": {"text": "' + b"x" * (3 * 1024 * 1024) + b'"}}'
DEEP = b'{"payload": ' + b"[" * 5000 + b"]" * 5000 + b"}"
SURROGATE = (
    b'{"name": "\\ud800", "event_type": "x.\\udc00", "inputs": {"s": "\\ud800"}, "payload": {"s": "\\udfff"}}'
)
BODIES = {
    "oversized": (BIG, "application/json", {}, {413}),
    "deep": (DEEP, "application/json", {}, {400}),
    "surrogate": (SURROGATE, "application/json", {}, None),  # refused, or stored so that it reads back
    "multipart": (
        b'--b\r\nContent-Disposition: form-data; name="inputs"\r\n\r\n{}\r\n--b--\r\n',
        "multipart/form-data; boundary=b",
        {},
        {415},
    ),  # fmt: skip
    "form": (b"inputs=%7B%7D&event_type=x.y", "application/x-www-form-urlencoded", {}, {415}),
    "gzip": (gzip.compress(b'{"inputs": {}}'), "application/json", {"HTTP_CONTENT_ENCODING": "gzip"}, {415}),
}


def write_routes() -> list[tuple[str, str, str]]:
    """(route, method, view name) of every write endpoint under /api/."""

    def walk(patterns, prefix=""):
        for pattern in patterns:
            if isinstance(pattern, URLResolver):
                yield from walk(pattern.url_patterns, prefix + str(pattern.pattern))
            else:
                yield prefix + str(pattern.pattern), pattern.callback

    routes = []
    for route, callback in walk(get_resolver().url_patterns):
        view = getattr(callback, "cls", None) or getattr(callback, "view_class", None)
        if route.startswith("api/") and view is not None:
            for method in ("post", "put", "patch", "delete"):
                if hasattr(view, method):
                    routes.append((route, method.upper(), view.__name__))
    return routes


ROUTES = write_routes()


@pytest.fixture
def world(db):
    workspace = workspace_get_or_create(slug="hostile")
    owner = member("hostile-admin", workspace, Role.ADMIN)
    automation = engine.automation_create(workspace=workspace, user=owner, definition={
        "schema_version": "1.0", "name": "target", "triggers": [{"key": "hook", "type": "webhook"}],
        "plan": [{"step_id": "t", "action": "transform_data", "config": {"output": "{{ inputs }}"}}]})  # fmt: skip
    trigger = automation.triggers.get()
    run = engine.run_create(automation=automation, inputs={}, user=owner).run
    credential = credential_create(
        workspace=workspace, name="api", kind="bearer", secret={"token": "t0ken-123"}
    )
    server = mcp_server_create(
        workspace=workspace, slug="files", url="https://mcp.example.com/mcp", user=owner
    )
    ids = {"AutomationDetail": automation.pk, "AutomationRun": automation.pk, "AutomationFire": automation.pk,
           "RunCancel": run.pk, "RunRerun": run.pk, "RunResolve": run.pk, "CredentialDetail": credential.pk,
           "CredentialSecret": credential.pk, "McpServerDetail": server.pk, "McpServerHarvest": server.pk,
           "TriggerRotateToken": trigger.pk, "TriggerRevokeToken": trigger.pk,
           "TriggerRotateSigningSecret": trigger.pk}  # fmt: skip
    return {
        "client": client_for(owner),
        "ids": ids,
        "token": trigger_token_rotate(trigger=trigger, user=owner),
    }


def concrete(route: str, view: str, ids: dict) -> str:
    path = "/" + route
    for converter, default in (("uuid", str(uuid.uuid4())), ("int", "999999"), ("str", str(uuid.uuid4()))):
        for name in ("pk", "automation_id"):
            path = path.replace(f"<{converter}:{name}>", str(ids.get(view, default)))
    return path.replace("<slug:slug>", "hostile")  # the world's workspace


def test_every_write_endpoint_is_covered():
    assert len(ROUTES) >= 23
    assert all("<" not in concrete(route, view, {}) for route, _, view in ROUTES)


@pytest.mark.parametrize("kind", list(BODIES))
@pytest.mark.parametrize(("route", "method", "view"), ROUTES, ids=[f"{m} {r}" for r, m, _ in ROUTES])
def test_hostile_body_gets_a_clean_answer_never_a_5xx(world, route, method, view, kind):
    # given
    body, content_type, extra, expected = BODIES[kind]
    client = world["client"]
    path = concrete(route, view, world["ids"])
    if view == "AutomationFire":  # past authentication, so the body is what is judged
        client = Client(HTTP_AUTHORIZATION=f"Bearer {world['token']}")
    # when
    response = client.generic(method, path, body, content_type=content_type, **extra)
    # then
    assert response.status_code < 500, response.content[:300]
    if response.status_code >= 400:
        assert response["Content-Type"].startswith("application/json")
        assert set(response.json()) in ({"error"}, {"errors"})
    if expected is not None:
        assert response.status_code in expected, (response.status_code, response.content[:300])
    elif response.status_code < 300 and "run_id" in (data := response.json()):
        assert client.get(f"/api/v1/runs/{data['run_id']}").status_code == 200


def test_lone_surrogates_in_run_inputs_and_filters_are_refused(world):
    client = world["client"]
    automation_id = world["ids"]["AutomationRun"]
    run = client.post(f"/api/v1/automations/{automation_id}/run", b'{"inputs": {"s": "\\ud800"}}',
                      content_type="application/json")  # fmt: skip
    definition = {"schema_version": "1.0", "name": "f", "plan": [{"step_id": "t", "action": "transform_data",
                  "config": {"output": 1}}], "triggers": [{"key": "e", "type": "event", "config": {
                  "event_type": "x.y", "filter": {"path": "payload.a", "equals": "SURROGATE"}}}]}  # fmt: skip
    raw = json.dumps({"definition": definition}).replace("SURROGATE", "\\ud800").encode()
    created = client.post("/api/v1/automations", raw, content_type="application/json")
    assert (run.status_code, created.status_code) == (400, 400)
    assert "surrogate" in run.json()["errors"][0]["message"]


def test_duplicate_keys_are_refused(world):
    response = world["client"].post("/api/v1/events", b'{"event_type": "a.b", "event_type": "c.d", "payload": {}}',
                                    content_type="application/json")  # fmt: skip
    assert response.status_code == 400
    assert "same key twice" in json.dumps(response.json())


def test_errors_on_api_paths_are_json_even_for_a_disallowed_host(db):
    response = Client().get("/api/v1/automations", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "INVALID_ARGUMENT"
