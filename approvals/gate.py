"""The approval gate the executor calls for a ``confirm`` step (SPEC §7.3).

``check_step`` answers whether the step may run now. The full implementation
(Approval rows, Ed25519 tokens, standing approvals) lives in this app.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GateRequest:
    workspace_id: int
    run_id: str
    automation_id: str
    automation_name: str
    step_key: str  # "<phase>:<index>:<step_id>", unique within the run
    step_id: str
    action: str
    capability_id: str
    risk: str
    reasons: list[str]
    what: Any  # the exact rendered config (credential values never appear here)
    message: str
    plan_hash: str
    requested_by: str
    last_editor_id: int | None
    approvals_required: int
    expires_in_seconds: int
    trace_id: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    status: str  # approved | pending | denied | expired | invalid
    message: str = ""
    approval_id: str | None = None


def check_step(request: GateRequest) -> Verdict:
    return Verdict("invalid", "approvals are not configured on this platform yet")
