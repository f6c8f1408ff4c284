"""The one set of builders for every test directory: people and their API clients, automation
definitions and steps, trigger configs, and a driver that runs automations in-process through
the real dispatcher and executor. The fixtures that use them live in tests/conftest.py."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.test import APIClient

from approvals.models import Approval
from approvals.services import approval_decide
from audit.models import AuditEvent
from automations.executor import execute_run
from automations.models import Run, RunStatus
from automations.services import automation_create, run_create, run_resume
from workspaces.api_tokens import token_create
from workspaces.services import membership_set_role

# --- people -------------------------------------------------------------------------------


def member(username: str, workspace, role: str, **extra):
    user = get_user_model().objects.create_user(username=username, password="pw-" + username, **extra)
    membership_set_role(workspace=workspace, user=user, role=role)
    return user


def api_token(user, scope: str = "full", **extra) -> str:
    """A new API token of the user's (another one each call; ``extra``: name, expires_at)."""
    return token_create(user=user, scope=scope, **extra)[1]


def client_for(user, scope: str = "full") -> APIClient:
    """An API client authenticated with a new token of the user's."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token(user, scope)}")
    return client


# --- definitions --------------------------------------------------------------------------
ECHO = {"step_id": "echo", "action": "transform_data", "config": {"output": {"ok": True}}}


def definition(*steps: dict, name: str = "test automation", plan: list | None = None,
               triggers: list | None = None, autonomy: str | None = None, on_failure: list | None = None,
               inputs_schema: dict | None = None, **extra: Any) -> dict:  # fmt: skip
    """An automation definition: ``steps`` (or ``plan=[...]``; one echo step when neither), and
    optionally triggers, execution settings (``autonomy``, ``on_failure``, or ``execution={...}``),
    an inputs schema, and any other top-level field as a keyword."""
    body: dict[str, Any] = {
        "schema_version": "1.0",
        "name": name,
        "plan": list(steps) or plan or [dict(ECHO)],
    }
    if triggers is not None:
        body["triggers"] = triggers
    execution = dict(extra.pop("execution", {}))
    if autonomy is not None:
        execution["autonomy"] = autonomy
    if on_failure is not None:
        execution["on_failure"] = on_failure
    if execution:
        body["execution"] = execution
    if inputs_schema is not None:
        body["inputs"] = {"schema": inputs_schema}
    body.update(extra)
    return body


def transform(step_id: str, output, **extra) -> dict:
    return {"step_id": step_id, "action": "transform_data", "config": {"output": output}, **extra}


def http_step(step_id: str, url: str, method: str = "GET", **extra: Any) -> dict:
    return {"step_id": step_id, "action": "http_request", "config": {"method": method, "url": url}, **extra}


# Steps of each risk (approvals.policy.step_risk), by whole tokens only (a step id is a label):
#   low      GET to url      (a read)
#   medium   POST to url     (an external write); at A2 it needs approval
#   high     DELETE to url   (an external write, medium; "DELETE is a destructive method": + 1)
#   critical critical_step(): the test MCP server's ``delete_note`` tool (an MCP tool is high until
#            an operator lowers it; its name's segment "delete" is a destructive verb: + 1)
RISK_STEPS = {"low": ("fetch", "GET"), "medium": ("create_item", "POST"), "high": ("erase", "DELETE")}


def risk_step(risk: str, url: str) -> dict:
    step_id, method = RISK_STEPS[risk]
    return http_step(step_id, url, method)


def critical_step(note: str) -> dict:
    """Deletes ``note`` through tests/capabilities/mcp_test_server.py's ``delete_note``, harvested as ``files``."""
    return {"step_id": "purge", "action": "call_capability",
            "config": {"capability": "files.delete_note", "args": {"text": note}}}  # fmt: skip


def harvest_approved(server, **kwargs):
    """Harvest an MCP server and approve the tools it lists for the first time (an admin's review)."""
    from capabilities import mcp
    from capabilities.models import McpTool

    result = mcp.mcp_harvest(server, **kwargs)
    for tool in McpTool.objects.filter(server=server, name__in=result.new):
        mcp.mcp_tool_approve(tool=tool)
    return result


# --- triggers -----------------------------------------------------------------------------
def webhook(key: str = "hook", **config) -> dict:
    return {"key": key, "type": "webhook", "config": config}


def schedule(key: str = "cron", cron: str = "0 * * * *", **config) -> dict:
    return {"key": key, "type": "schedule", "config": {"cron": cron, **config}}


def event(key: str = "on-event", event_type: str = "files.added", **config) -> dict:
    return {"key": key, "type": "event", "config": {"event_type": event_type, **config}}


def fire(client: APIClient, automation_id, body=b"{}", *, token: str | None = None, content_type="application/json",
         path_suffix: str = "", **headers):  # fmt: skip
    """POST to the fire endpoint with a raw body (bytes, or anything json.dumps takes)."""
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.generic("POST", f"/api/v1/automations/{automation_id}/fire{path_suffix}", body,
                          content_type=content_type, **headers)  # fmt: skip


# --- driving runs in-process --------------------------------------------------------------
class Driver:
    """Drive runs in-process through the real dispatcher and executor (the Celery task wraps the same call).

    ``drive(run_id)`` runs a run until it is at rest, letting parked timers come due and expired
    leases be taken over. The default author and operator (the ``owner`` and ``operator``
    fixtures) are made only when a call needs them.
    """

    def __init__(self, request):
        self._request = request

    def _fixture(self, name: str):
        return self._request.getfixturevalue(name)

    def __call__(self, run_id, max_rounds: int = 50) -> Run:
        for _ in range(max_rounds):
            run = Run.objects.get(pk=run_id)
            if run.status == RunStatus.WAITING:
                Run.objects.filter(pk=run_id).update(wake_at=timezone.now() - timedelta(seconds=1))
            elif run.status == RunStatus.RUNNING:
                if run.lease_expires_at is None or run.lease_expires_at > timezone.now():
                    return run
            elif run.status != RunStatus.QUEUED or run.enqueued_at is None:
                return run
            execute_run(str(run_id))
        raise AssertionError(f"run {run_id} did not come to rest")

    def automation(self, doc: dict, user=None, workspace=None):
        return automation_create(workspace=workspace or self._fixture("workspace"), definition=doc,
                                 user=user or self._fixture("owner"))  # fmt: skip

    def start(self, automation, inputs: dict | None = None, user=None) -> Run:
        """Create a run and execute it as far as it goes; returns the fresh run."""
        result = run_create(
            automation=automation, inputs=inputs or {}, user=user or self._fixture("operator")
        )
        execute_run(str(result.run.pk))
        result.run.refresh_from_db()
        return result.run

    def resume(self, run) -> Run:
        """What the ``autoplane.resume_run`` task does, then the worker's ``execute_run``."""
        run_resume(run_id=str(run.pk), reason="approval decided")
        execute_run(str(run.pk))
        run.refresh_from_db()
        return run

    def approval(self, run):
        return Approval.objects.filter(run_id=run.pk).order_by("-created_at").first()

    def step(self, run, step_id: str, phase: str = "plan"):
        return run.steps.get(step_id=step_id, phase=phase)

    def decide(self, approval, user, decision: str = "approve", reason: str = "", via: str = "api"):
        return approval_decide(approval_id=approval.pk, user=user, decision=decision, reason=reason, via=via)


def audit_types(trace_id: str) -> list[str]:
    return list(AuditEvent.objects.filter(trace_id=trace_id).order_by("id").values_list("type", flat=True))
