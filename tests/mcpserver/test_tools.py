"""The MCP tools in-process (no transport): scoping, roles, the shared write path,
hostile arguments, redaction-by-serializer, auditing, and the complete tool list."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.db import OperationalError
from jsonschema import Draft202012Validator

from approvals.models import Approval
from audit.models import AuditEvent
from automations import selectors
from automations.models import Run, RunStatus
from config.errors import ServiceError
from mcpserver.tools import TOOLS, UnknownTool, tool_call
from tests.factories import client_for
from tests.llm_server import reply_json

from .conftest import SUCCEEDS

pytestmark = pytest.mark.django_db

EXPECTED_TOOLS = {
    "list_automations",
    "describe_automation",
    "run_automation",
    "get_run",
    "list_pending_approvals",
    "get_audit_trace",
    "create_draft",
}


def call(user, name, **arguments):
    result = tool_call(user=user, name=name, arguments=arguments)
    errors = list(Draft202012Validator(TOOLS[name].output_schema).iter_errors(result))
    assert errors == [], f"{name} output does not match its output schema: {errors[0].message}"
    return result


def refused(user, name, **arguments) -> ServiceError:
    with pytest.raises(ServiceError) as caught:
        tool_call(user=user, name=name, arguments=arguments)
    return caught.value


# --- the list is complete, and nothing in it decides ---------------------------------------


def test_the_tool_list_is_exactly_look_fire_and_draft():
    assert set(TOOLS) == EXPECTED_TOOLS


@pytest.mark.parametrize("verb", ["approve", "deny", "decide", "resolve", "delete", "cancel", "edit", "update",
                                  "standing", "credential", "secret", "token"])  # fmt: skip
def test_no_tool_can_decide_edit_or_touch_secrets(verb):
    assert not [name for name in TOOLS if verb in name]


def test_annotations_tell_the_truth():
    writes = {name for name, tool in TOOLS.items() if not tool.read_only}
    assert writes == {"run_automation", "create_draft"}
    assert not TOOLS["run_automation"].idempotent
    assert all(tool.idempotent for tool in TOOLS.values() if tool.read_only)


def test_calling_an_approve_tool_is_an_unknown_tool_and_is_audited(owner, gated, drive):
    run = drive(
        tool_call(user=owner, name="run_automation", arguments={"automation_id": str(gated.pk)})["run_id"]
    )
    approval = Approval.objects.get(run_id=run.pk)

    with pytest.raises(UnknownTool):
        tool_call(user=owner, name="approve_approval", arguments={"approval_id": str(approval.pk)})

    approval.refresh_from_db()
    assert approval.status == "pending"
    event = AuditEvent.objects.filter(type="mcp.tool.called", payload__tool="approve_approval").get()
    assert event.outcome == "failure"
    assert event.actor == "user:owner"


# --- look ----------------------------------------------------------------------------------


def test_list_and_describe_show_the_workspace_and_nothing_else(viewer, greet, hidden):
    listed = call(viewer, "list_automations")
    assert [a["name"] for a in listed["automations"]] == ["greet"]
    assert listed["count"] == 1

    described = call(viewer, "describe_automation", automation_id=str(greet.pk))
    assert described["automation"]["definition"]["name"] == "greet"
    assert described["inputs_schema"]["required"] == ["who"]
    assert described["triggers"] == []
    assert described["last_runs"] == []


def test_another_workspaces_automation_is_not_found_for_every_tool(viewer, owner, hidden):
    for name, args in [("describe_automation", {"automation_id": str(hidden.pk)}),
                       ("run_automation", {"automation_id": str(hidden.pk)})]:  # fmt: skip
        assert refused(owner, name, **args).code == "NOT_FOUND"
    assert call(owner, "list_automations", search="secret")["count"] == 0
    assert not Run.objects.exists()


def test_list_filters_and_pages(owner, greet, gated):
    assert [a["name"] for a in call(owner, "list_automations", search="GAT")["automations"]] == ["gated"]
    page = call(owner, "list_automations", limit=1, offset=1)
    assert page["count"] == 2
    assert [a["name"] for a in page["automations"]] == ["greet"]


# --- fire ----------------------------------------------------------------------------------


def test_run_then_get_run_is_what_the_api_shows(operator, greet, drive):
    started = call(operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "ada"})
    assert started["status"] == "queued"
    assert started["status_url"] == f"/api/v1/runs/{started['run_id']}"
    drive(started["run_id"])

    run = call(operator, "get_run", run_id=started["run_id"])

    assert run["status"] == "succeeded"
    assert run["output"] == {"greeting": "hi ada"}
    assert run["triggered_by"] == "user:operator"
    assert run == client_for(operator).get(started["status_url"]).json()


def test_a_viewer_cannot_run(viewer, greet):
    error = refused(viewer, "run_automation", automation_id=str(greet.pk), inputs={"who": "x"})

    assert error.code == "PERMISSION_DENIED"
    assert not Run.objects.exists()
    event = AuditEvent.objects.get(type="mcp.tool.called")
    assert (event.actor, event.outcome, event.workspace_id) == ("user:viewer", "failure", greet.workspace_id)


def test_idempotency_keys_are_the_apis(operator, greet):
    api = client_for(operator)
    first = api.post(
        f"/api/v1/automations/{greet.pk}/run", {"who": "a"}, format="json", HTTP_IDEMPOTENCY_KEY="k1"
    )
    assert first.status_code == 202

    replay = call(
        operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "a"}, idempotency_key="k1"
    )
    other_body = refused(operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "b"},
                         idempotency_key="k1")  # fmt: skip

    assert replay["run_id"] == first.json()["run_id"]
    assert replay["deduplicated"] is True
    assert other_body.code == "UNPROCESSABLE"
    assert Run.objects.count() == 1


def test_without_a_key_every_call_is_a_new_run(operator, greet):
    ids = {call(operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "a"})["run_id"]
           for _ in range(2)}  # fmt: skip
    assert len(ids) == 2


# --- hostile arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "path"),
    [
        ({"automation_id": 12}, "/automation_id"),
        ({"automation_id": "not-a-uuid"}, "/automation_id"),
        ({}, "/"),
        ({"automation_id": "00000000-0000-0000-0000-000000000000", "inputs": []}, "/inputs"),
        ({"automation_id": "00000000-0000-0000-0000-000000000000", "approve": True}, "/"),
        ({"automation_id": "00000000-0000-0000-0000-000000000000", "idempotency_key": "k" * 256},
         "/idempotency_key"),
    ],
)  # fmt: skip
def test_wrong_arguments_are_invalid_argument_with_the_path(operator, arguments, path):
    error = refused(operator, "run_automation", **arguments)
    assert error.code == "INVALID_ARGUMENT"
    assert path in [problem["path"] for problem in error.errors]


def test_arguments_that_are_not_an_object_are_refused(operator):
    with pytest.raises(ServiceError) as caught:
        tool_call(user=operator, name="list_automations", arguments=["a"])
    assert caught.value.code == "INVALID_ARGUMENT"


def test_unknown_ids_are_not_found(operator):
    missing = "00000000-0000-0000-0000-000000000000"
    assert refused(operator, "run_automation", automation_id=missing).code == "NOT_FOUND"
    assert refused(operator, "get_run", run_id=missing).code == "NOT_FOUND"


def test_a_megabyte_of_inputs_is_payload_too_large(operator, greet):
    error = refused(
        operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "x" * (1024 * 1024)}
    )
    assert error.code == "PAYLOAD_TOO_LARGE"
    assert not Run.objects.exists()


def test_inputs_that_miss_the_automations_schema_are_refused_by_the_dispatcher(operator, greet):
    error = refused(operator, "run_automation", automation_id=str(greet.pk), inputs={"who": 5})
    assert error.code == "INVALID_ARGUMENT"
    assert error.errors[0]["path"] == "/inputs/who"


# --- approvals, audit, drafts -------------------------------------------------------------------


def test_pending_approvals_of_a_gated_run_are_listed_read_only(operator, viewer, outsider, gated, drive):
    run = drive(call(operator, "run_automation", automation_id=str(gated.pk))["run_id"])
    assert run.status == RunStatus.AWAITING_APPROVAL

    listed = call(viewer, "list_pending_approvals", run_id=str(run.pk))

    assert listed["count"] == 1
    (approval,) = listed["approvals"]
    assert (approval["step_id"], approval["status"], approval["run_id"]) == (
        "careful",
        "pending",
        str(run.pk),
    )
    assert call(outsider, "list_pending_approvals")["count"] == 0
    assert Approval.objects.get().status == "pending"


def test_a_runs_trace_holds_the_mcp_call_with_its_user(operator, outsider, greet, drive):
    started = call(operator, "run_automation", automation_id=str(greet.pk), inputs={"who": "a"})
    run = drive(started["run_id"])

    trace = call(operator, "get_audit_trace", trace_id=run.trace_id)

    types = [event["type"] for event in trace["events"]]
    assert types[0] == "run.created"
    assert "run.succeeded" in types
    mcp_event = next(event for event in trace["events"] if event["type"] == "mcp.tool.called")
    assert mcp_event["actor"] == "user:operator"
    assert mcp_event["payload"]["via"] == "mcp"
    assert mcp_event["refs"]["run"] == str(run.pk)
    assert call(outsider, "get_audit_trace", trace_id=run.trace_id)["count"] == 0


def test_every_call_is_audited_as_the_user_via_mcp(viewer, greet):
    call(viewer, "list_automations")
    call(viewer, "describe_automation", automation_id=str(greet.pk))

    events = AuditEvent.objects.filter(type="mcp.tool.called").order_by("id")
    assert [e.payload["tool"] for e in events] == ["list_automations", "describe_automation"]
    assert {(e.actor, e.payload["via"], e.workspace_id) for e in events} == {
        ("user:viewer", "mcp", greet.workspace_id)
    }


def test_drafting_without_an_llm_is_llm_not_configured(operator, settings):
    settings.LLM_BASE_URL = ""
    assert (
        refused(operator, "create_draft", prompt="every morning, post the weather").code
        == "LLM_NOT_CONFIGURED"
    )


def test_a_draft_is_the_drafting_service_and_saves_nothing(llm, operator, greet):
    proposal = {**SUCCEEDS, "name": "greet loudly"}
    llm.script(reply_json(proposal), reply_json({"summary": "Greets someone, loudly.", "flags": []}))

    draft = call(operator, "create_draft", prompt="greet people loudly", automation_id=str(greet.pk))

    assert draft["definition"] == proposal
    assert draft["summary"] == "Greets someone, loudly."
    assert draft["status"] == "ready"
    assert "greet loudly" in draft["diff"]
    assert client_for(operator).get(f"/api/v1/drafts/{draft['id']}").json()["definition"] == proposal
    greet.refresh_from_db()
    assert greet.version == 1


def test_a_viewer_cannot_draft(llm, viewer):
    assert refused(viewer, "create_draft", prompt="anything", workspace="acme").code == "PERMISSION_DENIED"


def test_the_documented_client_configs_run_this_server():
    text = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    configs = [
        json.loads(block)["mcpServers"]["autoplane"] for block in re.findall(r"```json\n(.*?)```", text, re.S)
    ]
    stdio, http = configs
    assert stdio["args"][-2:] == ["manage.py", "mcp_serve"]
    assert "AUTOPLANE_API_TOKEN" in stdio["env"]
    assert http["url"].endswith(":8765/mcp")
    assert http["headers"]["Authorization"].startswith("Bearer ")


def test_a_database_outage_is_temporarily_unavailable_not_a_crash(operator, monkeypatch):
    def down(user):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(selectors, "automations_visible_to", down)
    assert refused(operator, "list_automations").code == "TEMPORARILY_UNAVAILABLE"
