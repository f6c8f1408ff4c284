"""``agent_task`` steps driven through the real executor, with the real client talking to a
scripted OpenAI-compatible server: tool calls through the gate, the allowlist, output-schema
repair, budgets, approvals mid-conversation."""

from __future__ import annotations

from decimal import Decimal

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from audit.models import AuditEvent
from automations import services
from automations.models import Run, StepRun
from tests.factories import client_for, member
from tests.llm_server import reply_json, reply_text, reply_tool_call
from workspaces.models import Role

pytestmark = pytest.mark.django_db

ANSWER_SCHEMA = {"type": "object", "required": ["answer"], "additionalProperties": False,
                 "properties": {"answer": {"type": "string"}}}  # fmt: skip
CALL_COST = Decimal("0.002")  # 100 prompt + 20 completion tokens at the fixture's prices


def agent(step_id: str = "agent", **config) -> dict:
    return {"step_id": step_id, "action": "agent_task", "output_as": step_id,
            "config": {"prompt": "Summarise {{ inputs.topic }}", **config}}  # fmt: skip


def automation_with(workspace, owner, *steps, **execution):
    definition = {"schema_version": "1.0", "name": "agent test", "plan": list(steps),
                  "inputs": {"schema": {"type": "object", "properties": {"topic": {"type": "string"}}}},
                  "execution": {"autonomy": "A3", **execution}}  # fmt: skip
    return services.automation_create(workspace=workspace, definition=definition, user=owner)


def start(automation, user, drive, topic: str = "orders") -> Run:
    result = services.run_create(automation=automation, inputs={"topic": topic}, user=user)
    return drive(result.run.pk)


def step(run: Run, step_id: str = "agent") -> StepRun:
    return run.steps.get(step_id=step_id)


def test_an_allowlisted_tool_call_runs_and_the_validated_answer_is_the_output(
    llm, workspace, owner, operator, drive
):
    automation = automation_with(workspace, owner, agent(tools=["core.*"], output_schema=ANSWER_SCHEMA))
    llm.script(reply_tool_call("core_echo", {"x": 1}), reply_json({"answer": "done"}))

    run = start(automation, operator, drive)

    assert run.status == "succeeded", run.error
    agent_step = step(run)
    assert agent_step.output["data"] == {"answer": "done"}
    assert agent_step.output["usage"] == {
        "prompt_tokens": 200,
        "completion_tokens": 40,
        "turns": 2,
        "tool_calls": 1,
    }
    assert (agent_step.cost_usd, run.cost_usd) == (2 * CALL_COST, 2 * CALL_COST)
    first, second = llm.requests
    assert first["messages"][-1] == {"role": "user", "content": "Summarise orders"}  # the rendered prompt
    assert {t["function"]["name"] for t in first["tools"]} == {"core_echo", "core_http_get"}
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool"
    assert '"data": {"x": 1}' in tool_message["content"]
    row = AuditEvent.objects.get(type="agent.tool")
    assert (row.payload["tool"], row.payload["decision"], row.outcome) == ("core.echo", "allow", "success")


def test_a_tool_outside_the_allowlist_is_refused_and_never_called(
    llm, workspace, owner, operator, drive, http_server
):
    automation = automation_with(workspace, owner, agent(tools=["core.echo"]))
    llm.script(reply_tool_call("core_http_get", {"url": http_server.url + "/x"}, call_id="a"),
               reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/y"}, call_id="b"),
               reply_text("gave up on those"))  # fmt: skip

    run = start(automation, operator, drive)

    assert run.status == "succeeded"
    assert http_server.requests == []
    assert [t["function"]["name"] for t in llm.requests[0]["tools"]] == ["core_echo"]
    refusals = [m["content"] for m in llm.requests[2]["messages"] if m["role"] == "tool"]
    assert len(refusals) == 2
    assert all("POLICY_VIOLATION" in text for text in refusals)
    assert step(run).output["data"] == "gave up on those"


def test_tool_arguments_are_validated_against_the_input_schema(
    llm, workspace, owner, operator, drive, http_server
):
    automation = automation_with(workspace, owner, agent(tools=["core.http_get"]))
    llm.script(reply_tool_call("core_http_get", {"url": "ftp://nope", "credential": "slack"}),
               reply_tool_call("core_http_get", "{not json"), reply_text("ok"))  # fmt: skip

    run = start(automation, operator, drive)

    assert run.status == "succeeded"
    tool_results = [m["content"] for m in llm.requests[2]["messages"] if m["role"] == "tool"]
    assert all("INVALID_ARGUMENT" in text for text in tool_results)
    assert http_server.requests == []


def test_an_answer_that_fails_the_output_schema_is_fed_back_and_repaired(
    llm, workspace, owner, operator, drive
):
    automation = automation_with(workspace, owner, agent(output_schema=ANSWER_SCHEMA))
    llm.script(reply_text("The answer is 42."), reply_json({"answer": 42}), reply_json({"answer": "42"}))

    run = start(automation, operator, drive)

    assert run.status == "succeeded"
    assert step(run).output["data"] == {"answer": "42"}
    assert "not JSON" in llm.requests[1]["messages"][-1]["content"]
    assert "/answer" in llm.requests[2]["messages"][-1]["content"]
    assert step(run).output["usage"]["turns"] == 3


def test_no_acceptable_answer_within_max_turns_fails_the_step(llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent(output_schema=ANSWER_SCHEMA, max_turns=2))
    llm.script(reply_text("nope"), reply_text("still nope"))

    run = start(automation, operator, drive)

    assert (run.status, run.error["code"]) == ("failed", "INVALID_ARGUMENT")
    assert step(run).cost_usd == 2 * CALL_COST  # tokens spent on a failed step still count
    assert run.cost_usd == 2 * CALL_COST


def test_the_budget_bites_mid_run_and_run_cost_is_the_sum_of_its_steps(
    llm, workspace, owner, operator, drive
):
    automation = automation_with(workspace, owner, agent("first"), agent("second", tools=["core.echo"]),
                                 budget_cap_usd=0.004)  # fmt: skip
    # "second" asks for a tool, and then the budget (0.002 + 0.002 spent) leaves nothing for its next call
    llm.script(reply_text("first done"), reply_tool_call("core_echo", {}))

    run = start(automation, operator, drive)

    assert (run.status, run.error["code"], run.error["step_id"]) == ("failed", "BUDGET_EXCEEDED", "second")
    first, second = step(run, "first"), step(run, "second")
    assert (first.status, first.cost_usd) == ("succeeded", CALL_COST)
    assert (second.status, second.error_code) == ("failed", "BUDGET_EXCEEDED")
    assert second.cost_usd == CALL_COST
    assert len(llm.requests) == 2
    assert run.cost_usd == first.cost_usd + second.cost_usd


def test_a_charge_past_the_budget_fails_the_step_and_is_still_counted(llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent(), budget_cap_usd=0.001)
    llm.script(reply_text("expensive"))

    run = start(automation, operator, drive)

    assert (run.status, run.error["code"]) == ("failed", "BUDGET_EXCEEDED")
    assert (step(run).cost_usd, run.cost_usd) == (CALL_COST, CALL_COST)
    assert step(run).output["usage"] == {"prompt_tokens": 100, "completion_tokens": 20}


def test_a_tool_call_that_needs_approval_parks_the_run_and_continues_once_approved(
    llm, workspace, owner, operator, drive, http_server
):
    approver = member("approver", workspace, Role.APPROVER)
    automation = automation_with(workspace, owner, agent(tools=["http_request"]), autonomy="A2")
    args = {"method": "POST", "url": http_server.url + "/hook", "json": {"text": "hi"}}
    llm.script(reply_tool_call("http_request", args))

    run = start(automation, operator, drive)

    assert run.status == "awaiting_approval"
    assert (step(run).status, step(run).cost_usd) == ("awaiting_approval", CALL_COST)
    assert http_server.requests == []
    approval = Approval.objects.get(run_id=run.pk)
    assert approval.what == {"tool": "http_request", "args": args}
    assert approval.step_key == "plan:0:agent#t0"
    assert approval.capability_id == "http_request"

    approval_decide(approval_id=approval.pk, user=approver, decision="approve")
    services.run_resume(run_id=str(run.pk))
    llm.script(reply_text("posted"))
    run = drive(run.pk)

    assert run.status == "succeeded", run.error
    assert len(http_server.requests) == 1
    assert step(run).output["data"] == "posted"
    assert run.cost_usd == 2 * CALL_COST
    assert len(llm.requests) == 2  # the model was not asked again for the approved call
    assert [m["role"] for m in llm.requests[1]["messages"]][-2:] == ["assistant", "tool"]


def test_a_denied_tool_call_fails_the_step(llm, workspace, owner, operator, drive, http_server):
    approver = member("approver", workspace, Role.APPROVER)
    automation = automation_with(workspace, owner, agent(tools=["http_request"]), autonomy="A2")
    llm.script(reply_tool_call("http_request", {"method": "POST", "url": http_server.url + "/hook"}))
    run = start(automation, operator, drive)

    approval_decide(approval_id=Approval.objects.get(run_id=run.pk).pk, user=approver, decision="deny",
                    reason="not today")  # fmt: skip
    services.run_resume(run_id=str(run.pk))
    run = drive(run.pk)

    assert (run.status, run.error["code"]) == ("failed", "APPROVAL_DENIED")
    assert http_server.requests == []


def test_model_text_is_data_never_a_template(llm, workspace, owner, operator, drive):
    echo = {"step_id": "echo", "action": "transform_data", "config": {"output": {"said": "{{ agent }}"}}}
    automation = automation_with(workspace, owner, agent(), echo)
    llm.script(reply_text("{{ 7 * 7 }} {% for x in range(3) %}x{% endfor %}"))

    run = start(automation, operator, drive)

    assert run.status == "succeeded"
    assert run.output == {"said": "{{ 7 * 7 }} {% for x in range(3) %}x{% endfor %}"}


def test_without_an_llm_the_step_fails_clearly(no_llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent())

    run = start(automation, operator, drive)

    assert run.status == "failed"
    assert "LLM_NOT_CONFIGURED" in run.error["message"]


def test_an_invalid_output_schema_is_refused_at_save(workspace, owner):
    with pytest.raises(services.DefinitionInvalid) as caught:
        automation_with(workspace, owner, agent(output_schema={"type": "no-such-type"}))

    assert [e["code"] for e in caught.value.errors] == ["invalid_output_schema"]


def test_the_agent_is_never_told_a_secret_and_http_request_takes_no_credential(
    llm, workspace, owner, operator, drive
):
    from capabilities.credentials import credential_create

    credential_create(workspace=workspace, name="crm", kind="bearer", secret={"token": "tok-SECRET-VALUE-9"})
    automation = automation_with(workspace, owner, agent(tools=["http_request"],
                                                         prompt="Print the crm credential's token"))  # fmt: skip
    llm.script(reply_tool_call("http_request", {"url": "https://example.com", "credential": "crm"}),
               reply_text("I cannot see any token"))  # fmt: skip

    run = start(automation, operator, drive)

    assert run.status == "succeeded"
    assert "tok-SECRET-VALUE-9" not in llm.sent_text()
    (spec,) = llm.requests[0]["tools"]
    assert "credential" not in spec["function"]["parameters"]["properties"]
    refused = llm.requests[1]["messages"][-1]["content"]
    assert "INVALID_ARGUMENT" in refused


def test_a_1mb_answer_fails_the_step_and_binds_nothing(llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent())
    llm.script(reply_text("x" * (1024 * 1024)))

    run = start(automation, operator, drive)

    assert (run.status, run.error["code"]) == ("failed", "INVALID_ARGUMENT")
    assert run.context == {}
    assert run.cost_usd == 0  # an answer that never arrived is not charged


def test_audit_rows_per_agent_step(llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent(tools=["core.echo"]))
    llm.script(reply_tool_call("core_echo", {"a": 1}), reply_text("done"))

    run = start(automation, operator, drive)

    types = list(AuditEvent.objects.filter(refs__step="agent").order_by("id").values_list("type", flat=True))
    assert types == ["step.started", "agent.tool", "step.succeeded"]
    assert run.status == "succeeded"


def test_a_run_whose_estimate_exceeds_the_budget_cap_is_refused_at_dispatch(llm, workspace, owner, operator):
    # one call's least cost: 100 000 completion tokens at $50 per million = $5
    automation = automation_with(workspace, owner, agent(max_tokens=100_000), budget_cap_usd=1)

    response = client_for(operator).post(
        f"/api/v1/automations/{automation.pk}/run", {"topic": "x"}, format="json"
    )

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "BUDGET_EXCEEDED"
    assert Run.objects.count() == 0
    assert llm.requests == []


def test_token_usage_and_cost_are_in_the_steps_audit_row(llm, workspace, owner, operator, drive):
    automation = automation_with(workspace, owner, agent())
    llm.script(reply_text("done", prompt_tokens=1000, completion_tokens=10))

    start(automation, operator, drive)

    row = AuditEvent.objects.get(type="step.succeeded", refs__step="agent")
    assert row.payload["usage"] == {
        "prompt_tokens": 1000,
        "completion_tokens": 10,
        "turns": 1,
        "tool_calls": 0,
    }
    assert Decimal(row.payload["cost_usd"]) == Decimal("0.0105")
