"""Live: a cancel reaches an ``agent_task`` mid-turn — an LLM call or a tool call in flight.

A real worker runs the step against the scripted LLM server over real HTTP; the
model (or the tool's server) holds its answer for a minute, and the cancel must
not wait for it: the run ends ``cancelled`` within seconds, the step
``cancelled``, and the audit says what was interrupted.
"""

from __future__ import annotations

import pytest

from approvals.models import Approval
from approvals.services import approval_decide
from audit.models import AuditEvent
from automations import services
from automations.models import Run, RunStatus, StepRun
from tests.factories import definition, member
from tests.live import live_worker_env, wait_for
from tests.llm_server import Reply, reply_text, reply_tool_call
from workspaces.models import Role

pytestmark = pytest.mark.workers


@pytest.fixture
def agent_worker(llm, worker_factory):
    """A worker configured for the scripted LLM (settings changed in-process do not reach it)."""
    return worker_factory(env=live_worker_env(
        LLM_BASE_URL=llm.base_url, LLM_MODEL="scripted-model", LLM_API_KEY="sk-test-llm-key",
        LLM_TIMEOUT_SECONDS="100", LLM_MAX_RETRIES="0",
    ))  # fmt: skip


def _start(workspace, **config):
    automation = services.automation_create(workspace=workspace, definition=definition(
        {"step_id": "think", "action": "agent_task", "timeout_seconds": 110,
         "config": {"prompt": "Take your time", **config}},
    ))  # fmt: skip
    return services.run_create(automation=automation, inputs={}).run


def _cancel_and_wait(run) -> dict:
    services.run_cancel(run=run)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED, timeout=5, what="run cancelled"
    )
    assert StepRun.objects.get(run=run, step_id="think").status == "cancelled"
    event = AuditEvent.objects.get(trace_id=run.trace_id, type="step.cancelled")
    assert Run.objects.get(pk=run.pk).error["interrupted"] == event.payload["interrupted"]
    return event.payload


def test_cancel_abandons_an_llm_call_in_flight(llm, agent_worker, workspace):
    llm.script(Reply(body=reply_text("too late").body, delay=60))
    run = _start(workspace)
    assert llm.arrived.wait(30), "the model was never asked"

    payload = _cancel_and_wait(run)

    assert llm.answered == 0  # the model still holds its answer: the call was abandoned, not waited for
    assert payload["interrupted"] == "turn 1: the LLM call was abandoned in flight: the run was cancelled"


def test_cancel_interrupts_a_tool_call_in_flight(llm, agent_worker, workspace, slow_server):
    llm.script(reply_tool_call("core_http_get", {"url": slow_server.url, "timeout_seconds": 100}))
    run = _start(workspace, tools=["core.http_get"])
    # The test's server is on loopback: an agent-chosen URL to a non-public address asks a human first.
    wait_for(lambda: Approval.objects.filter(run_id=run.pk, status="pending").exists(), timeout=30,
             what="the fetch asks a human")  # fmt: skip
    approver = member("approver", workspace, Role.APPROVER)
    approval_decide(approval_id=Approval.objects.get(run_id=run.pk).pk, user=approver, decision="approve")
    services.run_resume(run_id=str(run.pk))  # a no-op if the decision's own resume came first
    assert slow_server.arrived.wait(30), "the tool's request never reached the server"

    payload = _cancel_and_wait(run)

    assert not slow_server.release.is_set()  # the server still holds its answer: the call was abandoned
    assert payload["interrupted"] == (
        "turn 1: tool call core_http_get was interrupted: "
        "the GET request to 127.0.0.1 was abandoned in flight (a read: nothing to undo)"
    )
    assert len(llm.requests) == 1  # the model was not asked again after the cancel
