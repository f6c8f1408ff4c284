"""Regexes in schemas users write run in RE2: a catastrophic-backtracking ``pattern`` costs
microseconds, on every path that validates against a user's or an MCP server's schema; a
pattern RE2 cannot run is refused at save with its path."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.gate import _accepts
from approvals.services import ApprovalError, standing_approval_create
from automations import services
from automations.models import Automation, Run
from capabilities import json_schema
from tests.factories import definition, fire
from triggers.services import trigger_token_rotate

pytestmark = pytest.mark.django_db

EVIL = "^(a+)+$"
VICTIM = "a" * 30 + "!"  # Python's re takes minutes on this; RE2 microseconds
CPU_BUDGET = 0.5  # seconds of this thread's CPU, for a whole request


def inputs_schema(prop: dict) -> dict:
    return {"type": "object", "properties": {"name": {"type": "string", **prop}}}


def timed(call):
    start = time.thread_time()
    result = call()
    return result, time.thread_time() - start


def test_run_now_with_a_backtracking_pattern_answers_promptly(api, workspace):
    automation = services.automation_create(workspace=workspace,
                                            definition=definition(inputs_schema=inputs_schema({"pattern": EVIL})))  # fmt: skip

    response, cpu = timed(lambda: api.post(f"/api/v1/automations/{automation.pk}/run",
                                           {"name": VICTIM}, format="json"))  # fmt: skip

    assert response.status_code == 400, response.content
    assert response.json()["errors"][0]["path"] == "/inputs/name"
    assert cpu < CPU_BUDGET
    assert not Run.objects.exists()
    ok = api.post(f"/api/v1/automations/{automation.pk}/run", {"name": "aaa"}, format="json")
    assert ok.status_code == 202, ok.content


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "patternProperties": {"^(a+)+$": {"type": "integer"}}},
        {
            "type": "object",
            "properties": {},
            "patternProperties": {"^(a+)+$": {}},
            "additionalProperties": False,
        },
        # a $schema inside would switch jsonschema back to its stock (re) validator
        {
            "type": "object",
            "properties": {
                "name": {
                    "$schema": "https://json-schema.org/draft/2020-12/schema",
                    "type": "string",
                    "pattern": EVIL,
                }
            },
        },  # fmt: skip
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$defs": {"n": {"pattern": EVIL}},
            "type": "object",
            "properties": {"name": {"$ref": "#/$defs/n"}},
        },  # fmt: skip
    ],
    ids=["patternProperties", "additionalProperties", "nested-$schema", "$ref"],
)
def test_webhook_fire_with_backtracking_patterns_answers_promptly(owner, workspace, client, schema):
    doc = definition(inputs_schema=schema, triggers=[{"key": "hook", "type": "webhook"}])
    automation = services.automation_create(workspace=workspace, definition=doc, user=owner)
    token = trigger_token_rotate(trigger=automation.triggers.get(key="hook"), user=owner)
    body = {"name": VICTIM, VICTIM: "x"}

    response, cpu = timed(lambda: fire(client, automation.pk, body, token=token))

    assert cpu < CPU_BUDGET
    assert response.status_code in (202, 400), response.content


@pytest.mark.parametrize(
    ("prop", "path"),
    [
        ({"pattern": "(?=a)a"}, "/inputs/schema/properties/name/pattern"),
        ({"pattern": r"(a)\1"}, "/inputs/schema/properties/name/pattern"),
        ({"patternProperties": {"(?!x)": {}}}, "/inputs/schema/properties/name/patternProperties"),
        ({"$ref": "https://example.com/schema.json"}, "/inputs/schema/properties/name/$ref"),
    ],
)
def test_a_schema_re2_cannot_run_is_refused_at_save_with_its_path(api, workspace, prop, path):
    response = api.post("/api/v1/automations", {"definition": definition(inputs_schema=inputs_schema(prop))},
                        format="json")  # fmt: skip

    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert any(e["path"] == path and e["code"] == "invalid_input_schema" for e in errors), errors
    assert not Automation.objects.exists()


def test_agent_output_schema_with_lookaround_is_refused_at_save(api, workspace):
    step = {"step_id": "ask", "action": "agent_task",
            "config": {"prompt": "hi", "output_schema": {"type": "string", "pattern": "(?<=a)b"}}}  # fmt: skip
    response = api.post("/api/v1/automations", {"definition": definition(step)}, format="json")

    assert response.status_code == 400, response.content
    assert any(e["code"] == "invalid_output_schema" and e["path"].endswith("/output_schema/pattern")
               for e in response.json()["errors"]), response.json()  # fmt: skip


def test_standing_approval_constraints_run_in_re2(workspace, owner):
    automation = services.automation_create(workspace=workspace, definition=definition(), user=owner)
    fields = dict(workspace=workspace, automation_id=automation.pk, capability_id="http_request", max_uses=1,
                  expires_at=timezone.now() + timedelta(hours=1), user=owner)  # fmt: skip
    with pytest.raises(ApprovalError) as refused:
        standing_approval_create(**fields, arg_constraint={"properties": {"url": {"pattern": "(?=x)"}}})
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "/properties/url/pattern" in refused.value.message

    constraint = {"type": "object", "properties": {"url": {"type": "string", "pattern": EVIL}}}
    accepted, cpu = timed(lambda: _accepts(constraint, {"url": VICTIM}))
    assert (accepted, cpu < CPU_BUDGET) == (False, True)
    assert _accepts(constraint, {"url": "aaaa"})


def test_mcp_tool_schemas_run_in_re2():
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": EVIL}}, "required": ["q"]}
    errors, cpu = timed(lambda: list(json_schema.validator(schema).iter_errors({"q": VICTIM})))
    assert [e.validator for e in errors] == ["pattern"]
    assert cpu < CPU_BUDGET
    # a server's schema RE2 cannot run makes the tool unusable, never a slow matcher
    with pytest.raises(json_schema.SchemaError):
        json_schema.check_schema({"properties": {"q": {"pattern": "(?=a)"}}})
    assert not json_schema.validator({"pattern": "(?=a)"}).is_valid("a")


def test_format_regex_means_re2(api, workspace):
    automation = services.automation_create(workspace=workspace,
                                            definition=definition(inputs_schema=inputs_schema({"format": "regex"})))  # fmt: skip
    refused = api.post(f"/api/v1/automations/{automation.pk}/run", {"name": "(?=a)"}, format="json")
    assert refused.status_code == 400, refused.content
    accepted = api.post(f"/api/v1/automations/{automation.pk}/run", {"name": "a+"}, format="json")
    assert accepted.status_code == 202, accepted.content
