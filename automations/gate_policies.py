"""What a workspace's policies add to the gate of one prepared step (issue 29).

Three things can make a step ask a human, or block it, whatever the autonomy x risk matrix says:

* **argument policies**: the workspace's ``policies`` and the step's own ``policy``
  (expressions/policy_rules.py), evaluated over the rendered config at each run; each rule that
  matches is audited as ``policy.matched``;
* a **credential that always asks** (``approval_always``) named by the step's config, or the
  credential of the MCP server whose tool the step (or an agent) calls;
* **quiet hours**: a step of medium or higher risk inside the workspace's window.

They can only tighten the gate: :func:`assess` says ``BLOCK``, ``CONFIRM`` or nothing, and
``gating.decision_for`` takes the stricter of that and the matrix. A step that no policy touches
costs a few attribute reads and no query (figures: docs/performance.md): the workspace's rules
arrive with the run's claim, compiled filters are cached by the rules' JSON, and the credential
table is read only for steps that name a credential or call an MCP server's tool.
"""

from __future__ import annotations

import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone

from approvals import policy
from audit import writer
from audit.models import Outcome
from capabilities import registry
from capabilities.base import Risk
from capabilities.models import Credential

from .expressions import policy_rules
from .models import Run
from .steps import PreparedStep


@dataclass(frozen=True)
class PolicyVerdict:
    decision: policy.Decision | None = None  # BLOCK or CONFIRM; None: the matrix alone decides
    reasons: tuple[str, ...] = ()  # why: shown to the approver, or in the refusal


NOTHING = PolicyVerdict()


def current_time() -> datetime:
    """The clock quiet hours are read on (tests put a fixed time here)."""
    return timezone.now()


def quiet_hours_holding(window: Any, now: datetime) -> str:
    """The window's text ("quiet hours (22:00-07:00 Europe/Berlin)") while it holds at ``now``, else "".

    A window is checked when saved; one written around the API that cannot be read counts as
    holding (fail closed: a step asks, a skipping schedule skips)."""
    if not window:
        return ""
    try:
        return policy.quiet_hours_text(window) if policy.in_quiet_hours(window, now) else ""
    except (KeyError, TypeError, ValueError, AttributeError, zoneinfo.ZoneInfoNotFoundError):
        return "quiet hours (the workspace's setting cannot be read, so it counts as quiet)"


def credential_names(config: Any) -> list[str]:
    """The credentials a rendered config names (``credential``, ``credentials``)."""
    if not isinstance(config, dict):
        return []
    names = [config["credential"]] if isinstance(config.get("credential"), str) else []
    listed = config.get("credentials")
    if isinstance(listed, list):
        names += [name for name in listed if isinstance(name, str)]
    return names


def mcp_server_slug(capability_id: str) -> str:
    """The MCP server a capability comes from ("files" for "files.delete_note"), "" for a native one:
    a step that calls a server's tool uses that server's credential."""
    if "." not in capability_id or registry.get_native_capability(capability_id) is not None:
        return ""
    return capability_id.split(".", 1)[0]


def assess(run: Run, prepared: PreparedStep, *, now: datetime | None = None) -> PolicyVerdict:
    """The policies' word on a prepared step: its rendered config, its risk, its own ``policy``."""
    return evaluate(run, prepared.step_id, prepared.config, prepared.risk, prepared.step.get("policy"), now=now,
                    capability_id=prepared.capability.id)  # fmt: skip


def evaluate(run: Run, step_id: str, config: Any, risk: Risk, step_rules: Any = None, *,
             now: datetime | None = None, subject: str = "", capability_id: str = "") -> PolicyVerdict:  # fmt: skip
    """The policies' word on ``config`` of risk ``risk``: a step's rendered config, or an agent tool
    call's own arguments (``subject``: the tool's id; the agent step's own ``policy`` is about the
    step's config, so it is not applied to them)."""
    workspace = run.workspace
    workspace_rules = workspace.policies
    quiet = workspace.quiet_hours
    names = credential_names(config)
    server = mcp_server_slug(capability_id) if capability_id else ""
    if not (workspace_rules or step_rules or quiet or names or server):
        return NOTHING
    asks: list[str] = []
    if workspace_rules or step_rules:
        verdict = _rules(run, step_id, config, workspace_rules or [], step_rules or [], subject)
        if verdict.decision == policy.Decision.BLOCK:
            return verdict
        asks += verdict.reasons
    if names or server:
        used = Q(name__in=names)
        if server:  # the server's credential goes with every call of its tools
            used |= Q(mcp_servers__slug=server, mcp_servers__workspace_id=run.workspace_id)
        always = Credential.objects.filter(used, workspace_id=run.workspace_id, approval_always=True)
        asks += [
            f"credential {name} always asks" for name in sorted(set(always.values_list("name", flat=True)))
        ]
    holding = quiet_hours_holding(quiet, now or current_time()) if quiet else ""
    if holding and risk >= policy.QUIET_HOURS_MIN_RISK:
        asks.append(holding)
    return PolicyVerdict(policy.Decision.CONFIRM, tuple(asks)) if asks else NOTHING


def _rules(run: Run, step_id: str, config: Any, workspace_rules: Sequence[Any], step_rules: Sequence[Any],
           subject: str) -> PolicyVerdict:  # fmt: skip
    found = policy_rules.first_match(policy_rules.compiled(list(workspace_rules)), config, "workspace")
    own = policy_rules.first_match(policy_rules.compiled(list(step_rules)), config, "step")
    decides = policy_rules.deciding(found, own)
    for match in (found, own):
        if match is not None:
            _audit(run, step_id, subject, match, applied=match is decides)
    if decides is None or decides.then == "auto":
        return NOTHING
    where = "workspace policy" if decides.source == "workspace" else "step policy"
    reason = f"{where} rule {decides.index + 1}: {decides.reason}"
    if decides.over_budget:
        reason += " (the rule took too long to evaluate, so it counts as matched)"
    decision = policy.Decision.BLOCK if decides.then == "block" else policy.Decision.CONFIRM
    return PolicyVerdict(decision, (reason,))


def _audit(run: Run, step_id: str, subject: str, match: policy_rules.Match, *, applied: bool) -> None:
    outcome = Outcome.FAILURE if match.then == "block" and applied else Outcome.INFO
    writer.append(
        trace_id=run.trace_id, type="policy.matched", workspace_id=run.workspace_id, stage="gate",
        summary=f"{step_id}{f' tool {subject[:100]}' if subject else ''}: {match.source} policy rule "
                f"{match.index + 1} matched ({match.then}): {match.reason}",
        outcome=outcome, actor="system:policies",
        refs={"run": str(run.pk), "automation": str(run.automation_id), "step": step_id},
        payload={"source": match.source, "rule": match.index, "then": match.then, "reason": match.reason,
                 "applied": applied, "over_budget": match.over_budget, **({"tool": subject[:200]} if subject else {})},
    )  # fmt: skip
