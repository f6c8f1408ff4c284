"""Risk and the gate matrix (SPEC §7.3). Pure: no database, no Django."""

from __future__ import annotations

import enum
import re
import zoneinfo
from collections.abc import Mapping
from datetime import datetime
from functools import lru_cache
from typing import Any

from capabilities.base import Capability, Risk, RiskInputs, SideEffect


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

# Whole tokens only (SPEC §7.3): a capability id is split into segments at
# ``.``, ``_``, ``-``, ``/`` and ``:``, and a segment must *be* one of these
# words ("db.drop_table" raises; "ui.dropdown_options" does not). A step's id is
# a label chosen by its author and never raises risk.
DESTRUCTIVE_VERBS = frozenset(
    {"delete", "remove", "destroy", "drop", "purge", "truncate", "wipe", "revoke", "terminate", "erase"}
)
DESTRUCTIVE_METHODS = frozenset({"DELETE"})
MANY_RECIPIENTS = 10
_SEGMENT = re.compile(r"[._:/-]+")


def gate(autonomy: str, risk: Risk) -> Decision:
    return GATE_MATRIX[autonomy][int(risk)]


def destructive_segments(capability_id: str) -> list[str]:
    return [seg for seg in _SEGMENT.split(capability_id.lower()) if seg in DESTRUCTIVE_VERBS]


def step_risk(
    capability: Capability,
    inputs: RiskInputs | None = None,
    *,
    recipients: int = 0,
) -> tuple[Risk, list[str]]:
    """The capability's risk raised one level per rule that applies; never lowered.

    Returns the risk and, for each rule that raised it, why and by how much
    ("DELETE is a destructive method: risk high → critical"): shown to the
    approver and in a refusal.
    """
    inputs = inputs or RiskInputs()
    rules: list[str] = []
    if SideEffect.EXTERNAL_WRITE in capability.side_effects and recipients > MANY_RECIPIENTS:
        rules.append(f"an external write to {recipients} recipients (more than {MANY_RECIPIENTS})")
    if inputs.method.upper() in DESTRUCTIVE_METHODS:
        rules.append(f"{inputs.method.upper()} is a destructive method")
    verbs = destructive_segments(capability.id)
    if verbs:
        rules.append(f"capability {capability.id} names a destructive verb ({verbs[0]})")
    risk = capability.risk
    reasons: list[str] = []
    for rule in rules:
        raised = risk.raised()
        reasons.append(f"{rule}: risk {risk.label} → {raised.label}")
        risk = raised
    if inputs.network and risk < Risk.HIGH:
        reasons.append(f"network access from a sandbox: risk {risk.label} → high")
        risk = Risk.HIGH
    return risk, reasons


# --- quiet hours ------------------------------------------------------------------
# Inside a workspace's quiet hours, steps of medium or higher risk ask a human (issue 29). Risk is
# not raised for them (SPEC §7.3's optional rule): raising a high-risk step to critical would
# block it at A3 instead of asking, and a low-risk step would start asking at A2.
QUIET_HOURS_MIN_RISK = Risk.MEDIUM


@lru_cache(maxsize=64)
def _zone(name: str) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(name)


def _minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


def in_quiet_hours(window: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether the aware ``now`` falls in ``window`` read on the wall clock of its time zone, so
    22:00-07:00 Europe/Berlin is 21:00-06:00 UTC in winter and 20:00-05:00 UTC in summer. The start
    is inside, the end is not; a window whose end is before its start runs across midnight."""
    if not window:
        return False
    local = now.astimezone(_zone(window["timezone"]))
    minute = local.hour * 60 + local.minute
    start, end = _minutes(window["start"]), _minutes(window["end"])
    if start < end:
        return start <= minute < end
    return minute >= start or minute < end


def quiet_hours_text(window: Mapping[str, Any]) -> str:
    return f"quiet hours ({window['start']}-{window['end']} {window['timezone']})"
