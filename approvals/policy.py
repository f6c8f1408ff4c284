"""Risk and the gate matrix (SPEC §7.3). Pure: no database, no Django."""

from __future__ import annotations

import enum
from collections.abc import Iterable

from capabilities.base import Capability, Risk, SideEffect


class Decision(enum.StrEnum):
    ALLOW = "allow"
    CONFIRM = "confirm"
    PREVIEW = "preview"
    BLOCK = "block"


_A, _C, _P, _B = Decision.ALLOW, Decision.CONFIRM, Decision.PREVIEW, Decision.BLOCK
GATE_MATRIX: dict[str, tuple[Decision, Decision, Decision, Decision]] = {
    #      low  medium high critical
    "A0": (_P, _P, _P, _P),
    "A1": (_C, _C, _C, _B),
    "A2": (_A, _C, _C, _B),
    "A3": (_A, _A, _C, _B),
    "A4": (_A, _A, _A, _C),
}

DESTRUCTIVE_VERBS = (
    "delete",
    "remove",
    "destroy",
    "drop",
    "purge",
    "truncate",
    "wipe",
    "revoke",
    "terminate",
)
MANY_RECIPIENTS = 10


def gate(autonomy: str, risk: Risk) -> Decision:
    return GATE_MATRIX[autonomy][int(risk)]


def step_risk(
    capability: Capability,
    *,
    recipients: int = 0,
    verbs: Iterable[str] = (),
    quiet_hours: bool = False,
    network: bool = False,
) -> tuple[Risk, list[str]]:
    """The capability's risk raised one level per adjuster that applies; never lowered.

    Returns the risk and the reasons it was raised (shown to the approver).
    """
    raises: list[str] = []
    if SideEffect.EXTERNAL_WRITE in capability.side_effects and recipients > MANY_RECIPIENTS:
        raises.append(f"external write to {recipients} recipients")
    words = " ".join(verbs).lower()
    if any(verb in words for verb in DESTRUCTIVE_VERBS):
        raises.append("destructive verb")
    if quiet_hours:
        raises.append("quiet hours")
    risk = capability.risk.raised(len(raises)) if raises else capability.risk
    if network and risk < Risk.HIGH:
        risk = Risk.HIGH
        raises.append("network access from a sandbox")
    return risk, raises
