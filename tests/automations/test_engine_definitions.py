"""Saving definitions through the API: every problem named by path and code, nothing written."""

from __future__ import annotations

import copy

import pytest
from jsonschema import Draft202012Validator

from audit.models import AuditEvent
from automations.models import Automation, AutomationVersion
from tests.factories import client_for, definition, transform

VALID = definition(
    transform("fetch", {"n": "{{ inputs.n }}"}, output_as="orders"),
    {"step_id": "post", "action": "http_request", "when": "{{ orders.n > 0 }}",
     "config": {"method": "POST", "url": "http://127.0.0.1:9/hook", "json": {"text": "{{ orders.n }} orders"}}},
    inputs={"schema": {"type": "object", "properties": {"n": {"type": "integer", "default": 1}}}},
    execution={"autonomy": "A3", "on_failure": [
        {"step_id": "alert", "action": "emit_event",
         "config": {"event_type": "digest.failed", "payload": {"error": "{{ run.error.message }}"}}}]},
)  # fmt: skip


def with_change(mutate):
    body = copy.deepcopy(VALID)
    mutate(body)
    return body


def step(i):
    return lambda body: body["plan"][i]


INVALID = [
    ("not an object", ["a list"], "/", "schema_violation"),
    ("missing plan", {"schema_version": "1.0", "name": "x"}, "/", "schema_violation"),
    (
        "wrong schema version",
        with_change(lambda b: b.update(schema_version="2.0")),
        "/schema_version",
        "schema_violation",
    ),
    ("empty name", with_change(lambda b: b.update(name="")), "/name", "schema_violation"),
    ("unknown top-level key", with_change(lambda b: b.update(code="import os")), "/", "schema_violation"),
    ("empty plan", with_change(lambda b: b.update(plan=[])), "/plan", "schema_violation"),
    (
        "bad step id",
        with_change(lambda b: b["plan"][0].update(step_id="../etc")),
        "/plan/0/step_id",
        "schema_violation",
    ),
    (
        "duplicate step id",
        with_change(lambda b: b["plan"][1].update(step_id="fetch")),
        "/plan/1/step_id",
        "duplicate_step_id",
    ),
    (
        "unknown action",
        with_change(lambda b: b["plan"][0].update(action="rm_rf")),
        "/plan/0/action",
        "unknown_action",
    ),
    (
        "config for another action",
        with_change(lambda b: b["plan"][0].update(config={"method": "GET"})),
        "/plan/0/config",
        "schema_violation",
    ),
    (
        "bad http method",
        with_change(lambda b: b["plan"][1]["config"].update(method="BREW")),
        "/plan/1/config/method",
        "schema_violation",
    ),
    (
        "template syntax error",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ inputs.n ")),
        "/plan/0/config/output",
        "TEMPLATE_ERROR",
    ),
    (
        "dunder access",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ inputs.__class__ }}")),
        "/plan/0/config/output",
        "TEMPLATE_ERROR",
    ),
    (
        "str.format escape",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ 'x'.format(inputs) }}")),
        "/plan/0/config/output",
        "TEMPLATE_ERROR",
    ),
    (
        "range global",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ range(10) }}")),
        "/plan/0/config/output",
        "TEMPLATE_ERROR",
    ),
    (
        "string bomb",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ 'a' * 999999999 }}")),
        "/plan/0/config/output",
        "TEMPLATE_LIMIT",
    ),
    (
        "power bomb",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ 10 ** 100000000 }}")),
        "/plan/0/config/output",
        "TEMPLATE_LIMIT",
    ),
    (
        "oversized template",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ 1 }}" + "x" * 9000)),
        "/plan/0/config/output",
        "TEMPLATE_LIMIT",
    ),
    (
        "forbidden filter",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ inputs | attr('x') }}")),
        "/plan/0/config/output",
        "TEMPLATE_ERROR",
    ),
    (
        "output used before defined",
        with_change(lambda b: b["plan"][0]["config"].update(output="{{ orders.n }}")),
        "/plan/0/config/output",
        "undefined_reference",
    ),
    (
        "when on undefined name",
        with_change(lambda b: b["plan"][1].update(when="{{ nope }}")),
        "/plan/1/when",
        "undefined_reference",
    ),
    (
        "reserved output name",
        with_change(lambda b: b["plan"][0].update(output_as="inputs")),
        "/plan/0/output_as",
        "reserved_name",
    ),
    (
        "negative retries",
        with_change(lambda b: b["plan"][0].update(max_retries=-1)),
        "/plan/0/max_retries",
        "schema_violation",
    ),
    (
        "huge timeout",
        with_change(lambda b: b["plan"][0].update(timeout_seconds=99999)),
        "/plan/0/timeout_seconds",
        "schema_violation",
    ),
    (
        "unknown autonomy",
        with_change(lambda b: b["execution"].update(autonomy="A9")),
        "/execution/autonomy",
        "schema_violation",
    ),
    (
        "unknown concurrency",
        with_change(lambda b: b["execution"].update(concurrency="yolo")),
        "/execution/concurrency",
        "schema_violation",
    ),
    (
        "invalid input schema",
        with_change(lambda b: b["inputs"].update(schema={"type": "nope"})),
        "/inputs/schema",
        "invalid_input_schema",
    ),
    (
        "unknown default token",
        with_change(lambda b: b["inputs"]["schema"]["properties"]["n"].update(default="$boom")),
        "/inputs/schema/properties/n/default",
        "unknown_token",
    ),
    (
        "bad cron",
        with_change(
            lambda b: b.update(triggers=[{"key": "t", "type": "schedule", "config": {"cron": "61 * * * *"}}])
        ),
        "/triggers/0/config/cron",
        "invalid_cron",
    ),
    (
        "every second cron",
        with_change(
            lambda b: b.update(triggers=[{"key": "t", "type": "schedule", "config": {"cron": "* * * * * *"}}])
        ),
        "/triggers/0/config/cron",
        "invalid_cron",
    ),
    (
        "bad timezone",
        with_change(
            lambda b: b.update(
                triggers=[
                    {"key": "t", "type": "schedule", "config": {"cron": "0 9 * * *", "timezone": "Mars/Base"}}
                ]
            )
        ),
        "/triggers/0/config/timezone",
        "invalid_timezone",
    ),
    (
        "duplicate trigger key",
        with_change(
            lambda b: b.update(triggers=[{"key": "t", "type": "webhook"}, {"key": "t", "type": "webhook"}])
        ),
        "/triggers/1/key",
        "duplicate_trigger_key",
    ),
    (
        "unknown trigger type",
        with_change(lambda b: b.update(triggers=[{"key": "t", "type": "carrier-pigeon"}])),
        "/triggers/0/type",
        "schema_violation",
    ),
    (
        "invalid filter",
        with_change(
            lambda b: b.update(
                triggers=[
                    {
                        "key": "t",
                        "type": "event",
                        "config": {
                            "event_type": "files.added",
                            "filter": {"path": "payload.x", "regex": "(a)\\1"},
                        },
                    }
                ]
            )
        ),
        "/triggers/0/config/filter",
        "invalid_regex",
    ),
    (
        "unknown capability",
        with_change(
            lambda b: b["plan"].append(
                {
                    "step_id": "cap",
                    "action": "call_capability",
                    "config": {"capability": "nope.nothing", "args": {}},
                }
            )
        ),
        "/plan/2/config/capability",
        "unknown_capability",
    ),
    (
        "unknown credential",
        with_change(lambda b: b["plan"][1]["config"].update(credential="missing-cred")),
        "/plan/1/config/credential",
        "unknown_credential",
    ),
    (
        "bad jmespath",
        with_change(lambda b: b["plan"][0]["config"].update(jmespath="[[[")),
        "/plan/0/config",
        "invalid_jmespath",
    ),
]


@pytest.mark.django_db
def test_valid_definition_is_created_with_version_1(api, workspace):
    response = api.post("/api/v1/automations", VALID, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["version"] == 1
    assert body["status"] == "active"
    assert body["workspace"] == "acme"
    assert body["definition"] == VALID
    assert AutomationVersion.objects.filter(automation_id=body["id"], version=1).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(("name", "body", "path", "code"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_definition_is_refused_with_path_and_code(api, workspace, name, body, path, code):
    audit_before = AuditEvent.objects.count()
    response = api.post("/api/v1/automations", {"definition": body}, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(e["path"].startswith(path) and e["code"] == code for e in errors), errors
    assert Automation.objects.count() == 0
    assert AuditEvent.objects.count() == audit_before
    text = response.content.decode()
    assert "Traceback" not in text
    assert "<class" not in text
    assert "object at 0x" not in text


def test_there_are_at_least_25_invalid_cases():
    assert len(INVALID) >= 25


@pytest.mark.django_db
@pytest.mark.parametrize(("given", "expected"), [(None, 200), ("own", 200), ("globex", 400), (0, 400)])
def test_an_update_names_only_its_own_workspace(api, workspace, other_workspace, given, expected):
    created = api.post("/api/v1/automations", VALID, format="json").json()
    body = {"definition": with_change(lambda b: b.update(name="renamed"))}
    if given is not None:
        body["workspace"] = workspace.slug if given == "own" else given
    audit_before = AuditEvent.objects.count()

    response = api.put(f"/api/v1/automations/{created['id']}", body, format="json")

    assert response.status_code == expected, response.content
    automation = Automation.objects.get(pk=created["id"])
    assert automation.workspace_id == workspace.pk
    if expected == 400:
        assert [e["path"] for e in response.json()["errors"]] == ["/workspace"]
        assert automation.version == 1
        assert AuditEvent.objects.count() == audit_before


@pytest.mark.django_db
def test_update_bumps_version_and_keeps_history(api, workspace):
    created = api.post("/api/v1/automations", VALID, format="json").json()
    changed = with_change(lambda b: b.update(name="renamed"))
    response = api.put(f"/api/v1/automations/{created['id']}", {"definition": changed}, format="json")
    assert response.status_code == 200
    assert response.json()["version"] == 2
    assert response.json()["name"] == "renamed"
    versions = api.get(f"/api/v1/automations/{created['id']}/versions").json()["results"]
    assert [v["version"] for v in versions] == [2, 1]
    assert versions[1]["definition"]["name"] == VALID["name"]


@pytest.mark.django_db
def test_invalid_update_changes_nothing(api, workspace):
    created = api.post("/api/v1/automations", VALID, format="json").json()
    bad = with_change(lambda b: b["plan"][0].update(action="nope"))
    response = api.patch(f"/api/v1/automations/{created['id']}", {"definition": bad}, format="json")
    assert response.status_code == 400
    automation = Automation.objects.get(pk=created["id"])
    assert automation.version == 1
    assert automation.definition == VALID
    assert AutomationVersion.objects.filter(automation=automation).count() == 1


@pytest.mark.django_db
def test_pause_and_resume_via_patch(api, workspace):
    created = api.post("/api/v1/automations", VALID, format="json").json()
    response = api.patch(f"/api/v1/automations/{created['id']}", {"status": "paused"}, format="json")
    assert response.json()["status"] == "paused"
    assert response.json()["version"] == 1


def test_definition_schema_is_published_and_valid(client):
    response = client.get("/api/v1/schema/definition")
    assert response.status_code == 200
    schema = response.json()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"].endswith("2020-12/schema")
    assert Draft202012Validator(schema).is_valid(VALID)


@pytest.mark.django_db
def test_viewer_cannot_create_and_outsider_cannot_see(api, workspace, viewer, outsider):
    created = api.post("/api/v1/automations", VALID, format="json").json()
    assert client_for(viewer).post("/api/v1/automations", VALID, format="json").status_code in (400, 403)
    assert client_for(viewer).get(f"/api/v1/automations/{created['id']}").status_code == 200
    assert client_for(viewer).delete(f"/api/v1/automations/{created['id']}").status_code == 403
    stranger = client_for(outsider)
    assert stranger.get(f"/api/v1/automations/{created['id']}").status_code == 404
    assert stranger.get("/api/v1/automations").json()["count"] == 0
    assert stranger.post(f"/api/v1/automations/{created['id']}/run", {}, format="json").status_code == 404
    assert (
        stranger.patch(
            f"/api/v1/automations/{created['id']}", {"status": "paused"}, format="json"
        ).status_code
        == 404
    )


def test_unauthenticated_requests_get_json_401(client):
    response = client.get("/api/v1/automations")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] in ("UNAUTHENTICATED", "PERMISSION_DENIED")
