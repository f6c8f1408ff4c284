"""Helpers for the approvals tests: definitions, steps of each risk, and a driver that runs
automations in-process through the real dispatcher and executor."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def definition(*steps: dict, autonomy: str = "A3", on_failure: list | None = None, name: str = "approvals-test",
               inputs_schema: dict | None = None, **execution: Any) -> dict:  # fmt: skip
    doc: dict[str, Any] = {
        "schema_version": "1.0",
        "name": name,
        "plan": list(steps),
        "execution": {"autonomy": autonomy, **execution},
    }
    if on_failure:
        doc["execution"]["on_failure"] = on_failure
    if inputs_schema:
        doc["inputs"] = {"schema": inputs_schema}
    return doc


def http_step(step_id: str, url: str, method: str = "GET", **extra: Any) -> dict:
    return {"step_id": step_id, "action": "http_request", "config": {"method": method, "url": url}, **extra}


# Steps of each risk against the local server (policy.step_risk):
#   low      GET                                        (read)
#   medium   POST                                       (external write)
#   high     POST whose step id names a destructive verb (medium + 1)
#   critical DELETE                                     (high, + 1 for the destructive verb itself)
RISK_STEPS = {
    "low": ("fetch", "GET"),
    "medium": ("create_item", "POST"),
    "high": ("remove_item", "POST"),
    "critical": ("erase", "DELETE"),
}


def risk_step(risk: str, url: str) -> dict:
    step_id, method = RISK_STEPS[risk]
    return http_step(step_id, url, method)


class Driver:
    """Drive runs in-process through the real dispatcher and executor."""

    def __init__(self, people: SimpleNamespace):
        self.people = people

    def automation(self, doc: dict, user=None, workspace=None):
        from automations.services import automation_create

        return automation_create(workspace=workspace or self.people.workspace, definition=doc,
                                 user=user or self.people.owen)  # fmt: skip

    def start(self, automation, inputs: dict | None = None, user=None):
        """Create a run and execute it as far as it goes; returns the fresh run."""
        from automations.executor import execute_run
        from automations.services import run_create

        result = run_create(automation=automation, inputs=inputs or {}, user=user or self.people.oscar)
        execute_run(str(result.run.pk))
        result.run.refresh_from_db()
        return result.run

    def resume(self, run):
        """What the ``autoplane.resume_run`` task does, then the worker's ``execute_run``."""
        from automations.executor import execute_run
        from automations.services import run_resume

        run_resume(run_id=str(run.pk), reason="approval decided")
        execute_run(str(run.pk))
        run.refresh_from_db()
        return run

    def approval(self, run):
        from approvals.models import Approval

        return Approval.objects.filter(run_id=run.pk).order_by("-created_at").first()

    def step(self, run, step_id: str, phase: str = "plan"):
        return run.steps.get(step_id=step_id, phase=phase)

    def decide(self, approval, user, decision: str = "approve", reason: str = "", via: str = "api"):
        from approvals.services import approval_decide

        return approval_decide(approval_id=approval.pk, user=user, decision=decision, reason=reason, via=via)


def audit_types(trace_id: str) -> list[str]:
    from audit.models import AuditEvent

    return list(AuditEvent.objects.filter(trace_id=trace_id).order_by("id").values_list("type", flat=True))
