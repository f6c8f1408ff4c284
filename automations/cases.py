"""Test cases (issue 34): a finished run recorded as a case, and a case replayed through the executor.

A case: ``{"automation": slug, "workspace": slug, "trigger": {type, key, payload}, "inputs": {...},
"steps": {step_id: {action, status, output, summary, error?, config}}, "approvals": [{step_id,
status}], "expect": {status, output, error_code}}``. ``automations test`` creates a run of the
automation's *current* definition with the case's inputs, drives it through the real executor
in-process with the recorded outputs standing in for every call (:mod:`automations.replay`),
decides its approvals as the case says, and compares. Everything it wrote is rolled back.
"""

from __future__ import annotations

import difflib
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from xml.etree import ElementTree as ET  # noqa: N817 - the usual name

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, ApprovalStatus
from approvals.services import approval_decide
from config.errors import ServiceError
from workspaces.models import Role
from workspaces.services import membership_set_role

from . import replay
from .as_code import automation_slug
from .dispatcher import DispatchRequest, dispatch
from .executor import execute_run
from .models import FINAL_RUN_STATUSES, Automation, Run, RunStatus
from .services import run_resume

CASE_KEYS = frozenset(
    {"automation", "workspace", "recorded_from", "trigger", "inputs", "steps", "approvals", "expect"}
)
DECIDED = {
    ApprovalStatus.APPROVED: "approve",
    ApprovalStatus.CONSUMED: "approve",
    ApprovalStatus.DENIED: "deny",
}


def run_test_case(run: Run) -> dict[str, Any]:
    """The case a finished run makes: what came in, what each step answered, what was asked, how it ended."""
    if run.status not in FINAL_RUN_STATUSES:
        raise ServiceError("CONFLICT", f"the run is {run.status}: record a finished run", 409)
    steps: dict[str, dict[str, Any]] = {}
    for step_run in run.steps.order_by("phase", "index"):
        recorded: dict[str, Any] = {"action": step_run.action, "status": step_run.status}
        envelope = step_run.output or {}
        if step_run.status == "succeeded":
            recorded.update(output=envelope.get("data"), summary=envelope.get("summary") or "")
        if step_run.error_code:
            recorded["error"] = {"code": step_run.error_code, "message": step_run.error_message}
        if step_run.rendered_config is not None:
            recorded["config"] = step_run.rendered_config
        steps[step_run.step_id] = recorded
    approvals = [
        {"step_id": a.step_id, "status": "approved" if a.status == ApprovalStatus.CONSUMED else a.status}
        for a in Approval.objects.filter(run_id=run.pk).order_by("created_at")
    ]
    return {
        "automation": automation_slug(run.automation.name),
        "workspace": run.automation.workspace.slug,
        "recorded_from": {"run": str(run.pk), "version": run.automation_version},
        "trigger": {"type": run.trigger_type, "key": run.trigger_key, "payload": run.trigger_payload},
        "inputs": run.inputs,
        "steps": steps,
        "approvals": approvals,
        "expect": {"status": run.status, "output": run.output, "error_code": (run.error or {}).get("code")},
    }


@dataclass
class CaseResult:
    name: str
    passed: bool = True
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, what: str, expected: Any, actual: Any) -> None:
        self.passed = False
        self.problems.append(f"{what} differs:\n" + _diff(expected, actual))


def _text(value: Any) -> list[str]:
    return (json.dumps(value, sort_keys=True, indent=2, default=str) + "\n").splitlines(keepends=True)


def _diff(expected: Any, actual: Any) -> str:
    return "".join(difflib.unified_diff(_text(expected), _text(actual), fromfile="case", tofile="now"))


class _Rollback(Exception):
    pass


def _case_problem(case: Any) -> str | None:
    if not isinstance(case, dict):
        return "a case is a JSON object"
    unknown = sorted(set(case) - CASE_KEYS)
    if unknown:
        return f"unknown key(s) {', '.join(unknown)}"
    if not isinstance(case.get("automation"), str) or not isinstance(case.get("workspace"), str):
        return "a case names its automation and workspace (slugs)"
    if not isinstance(case.get("inputs", {}), dict) or not isinstance(case.get("steps", {}), dict):
        return "inputs and steps are JSON objects"
    if not isinstance(case.get("expect", {}), dict) or not isinstance(case.get("approvals", []), list):
        return "expect is an object and approvals a list"
    return None


def _automation(case: Mapping[str, Any]) -> Automation | None:
    for automation in Automation.objects.filter(workspace__slug=case["workspace"], archived_at__isnull=True):
        if automation_slug(automation.name) == case["automation"]:
            return automation
    return None


def _decide(run: Run, decisions: dict[str, str]) -> bool:
    """Decide the run's pending approval as the case says (fresh approvers, rolled back); False if none."""
    approval = (
        Approval.objects.filter(run_id=run.pk, status=ApprovalStatus.PENDING).order_by("-created_at").first()
    )
    if approval is None or approval.step_id not in decisions:
        return False
    users = get_user_model().objects
    for _ in range(10):  # a quorum takes several approvers; four-eyes counts none of these out
        user = users.create_user(username=f"case-approver-{uuid.uuid4().hex[:12]}")
        membership_set_role(workspace=run.automation.workspace, user=user, role=Role.APPROVER)
        approval = approval_decide(approval_id=approval.pk, user=user, decision=decisions[approval.step_id],
                                   reason="automations test", via="api")  # fmt: skip
        if approval.status != ApprovalStatus.PENDING:
            break
    if approval.status in (ApprovalStatus.APPROVED, ApprovalStatus.DENIED):
        run_resume(run_id=str(run.pk), reason="approval decided")
        return True
    return False


def _drive(run_id: str, decisions: dict[str, str]) -> Run:
    for _ in range(200):
        run = Run.objects.get(pk=run_id)
        if run.status == RunStatus.WAITING:  # a wait step's timer: come due at once
            Run.objects.filter(pk=run_id).update(wake_at=timezone.now() - timedelta(seconds=1))
        elif run.status == RunStatus.AWAITING_APPROVAL:
            if not _decide(run, decisions):
                return run
            continue
        elif run.status != RunStatus.QUEUED or run.enqueued_at is None:
            return run
        execute_run(run_id)
    return Run.objects.get(pk=run_id)


def case_replay(case: Any, name: str = "case") -> CaseResult:
    """Replay ``case`` against its automation's current definition; nothing it does is kept."""
    result = CaseResult(name=name)
    started = time.perf_counter()
    problem = _case_problem(case)
    automation = None if problem else _automation(case)
    if problem or automation is None:
        result.passed = False
        result.problems.append(
            problem or f"no automation '{case['automation']}' in workspace '{case['workspace']}'"
        )
        return result
    stand_in = replay.Replay(case.get("steps") or {})
    decisions = {
        str(a.get("step_id")): DECIDED[a["status"]]
        for a in case.get("approvals") or []
        if isinstance(a, dict) and a.get("status") in DECIDED
    }
    trigger = case.get("trigger") or {}
    try:
        with transaction.atomic(), replay.active(stand_in):
            dispatched = dispatch(DispatchRequest(
                automation_id=automation.pk, automation=automation, inputs=dict(case.get("inputs") or {}),
                trigger_type=str(trigger.get("type") or "manual"), trigger_key=str(trigger.get("key") or ""),
                trigger_payload=dict(trigger.get("payload") or {}), triggered_by="automations test",
            ))  # fmt: skip
            if dispatched.run is None:
                result.passed = False
                result.problems.append("the run was not created (suppressed by the concurrency policy)")
                raise _Rollback
            run = _drive(str(dispatched.run.pk), decisions)
            _compare(result, case, run, stand_in)
            raise _Rollback
    except _Rollback:
        pass
    result.seconds = time.perf_counter() - started
    return result


def _taken(statuses: Mapping[str, Any]) -> list[str]:
    return sorted(step_id for step_id, status in statuses.items() if status not in ("skipped", "pending"))


def _compare(result: CaseResult, case: Mapping[str, Any], run: Run, stand_in: replay.Replay) -> None:
    expect = case.get("expect") or {}
    if "status" in expect and expect["status"] != run.status:
        result.fail("the run's status", expect["status"], run.status)
    if "output" in expect and expect["output"] != run.output:
        result.fail("the run's output", expect["output"], run.output)
    if expect.get("error_code") is not None and expect["error_code"] != (run.error or {}).get("code"):
        result.fail("the run's error", expect["error_code"], (run.error or {}).get("code"))
    actual_steps = {s.step_id: s for s in run.steps.all()}
    for step_id, recorded in (case.get("steps") or {}).items():
        step_run = actual_steps.get(step_id)
        status = step_run.status if step_run else None
        if isinstance(recorded, dict) and "status" in recorded and recorded["status"] != status:
            result.fail(f"step '{step_id}' status", recorded["status"], status)
        if isinstance(recorded, dict) and "config" in recorded and step_run is not None:
            sent = stand_in.sent.get(step_id, step_run.rendered_config)
            if recorded["config"] != sent:
                result.fail(f"step '{step_id}' rendered config", recorded["config"], sent)
    if "recorded_from" in case:  # a recorded case: the run takes the same path, step for step
        recorded_path = _taken(
            {k: v.get("status") for k, v in (case.get("steps") or {}).items() if isinstance(v, dict)}
        )
        path_now = _taken({step_id: s.status for step_id, s in actual_steps.items()})
        if recorded_path != path_now:
            result.fail("the steps taken", recorded_path, path_now)
    asked = [a.step_id for a in Approval.objects.filter(run_id=run.pk).order_by("created_at")]
    expected_asked = [a.get("step_id") for a in case.get("approvals") or [] if isinstance(a, dict)]
    if "approvals" in case and asked != expected_asked:
        result.fail("the approvals asked for", expected_asked, asked)


def junit_xml(results: list[CaseResult]) -> str:
    failures = sum(not r.passed for r in results)
    suite = ET.Element("testsuite", name="autoplane automations test", tests=str(len(results)),
                       failures=str(failures), time=f"{sum(r.seconds for r in results):.3f}")  # fmt: skip
    for r in results:
        testcase = ET.SubElement(
            suite, "testcase", classname="automations", name=r.name, time=f"{r.seconds:.3f}"
        )
        if not r.passed:
            failure = ET.SubElement(testcase, "failure", message=r.problems[0].splitlines()[0])
            failure.text = "\n\n".join(r.problems)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
