"""Risk is raised by whole tokens only (SPEC §7.3): a step id is a label, and every raise says why."""

from __future__ import annotations

import pytest

from approvals import policy
from automations.definition import describe_step
from automations.steps import risk_for
from capabilities import registry
from capabilities.base import Capability, Risk, RiskInputs, SideEffect
from tests.factories import definition, http_step, risk_step


def risk_of(step: dict) -> tuple[Risk, list[str]]:
    """What the engine computes for a step (automations.steps.risk_for)."""
    return risk_for(registry.get_action(step["action"]), step["config"], describe_step(step))


@pytest.mark.parametrize(
    "step_id",
    [
        "dropdown_options",
        "removed_count",
        "cache_wiped",
        "erased_rows",
        "drops",
        "wipe_cache",
        "delete_user",
        "drop_table",
        "remove_item",
    ],
)
def test_a_step_id_raises_nothing_whatever_it_says(step_id):
    step = {"step_id": step_id, "action": "transform_data", "config": {"value": "{{ inputs }}"}}

    assert risk_of(step) == (Risk.LOW, [])


@pytest.mark.parametrize(
    ("capability_id", "raised"),
    [
        ("db.drop_table", True),
        ("crm/contacts:delete", True),
        ("files.wipe", True),
        ("ui.dropdown_options", False),
        ("stats.removed_count", False),
        ("cache.wiped_at", False),
    ],
)
def test_capability_ids_raise_risk_only_by_whole_segments(capability_id, raised):
    capability = Capability(
        id=capability_id, risk=Risk.MEDIUM, side_effects=frozenset({SideEffect.EXTERNAL_WRITE})
    )

    risk, reasons = policy.step_risk(capability)

    assert risk == (Risk.HIGH if raised else Risk.MEDIUM)
    assert bool(reasons) is raised


@pytest.mark.parametrize(
    ("method", "expected"), [("GET", Risk.LOW), ("POST", Risk.MEDIUM), ("DELETE", Risk.CRITICAL)]
)
def test_http_method_is_a_token(method, expected):
    step = {
        "step_id": "fetch_all",
        "action": "http_request",
        "config": {"method": method, "url": "http://x/"},
    }

    assert risk_of(step)[0] == expected


def test_delete_raise_is_explained():
    step = {
        "step_id": "cleanup",
        "action": "http_request",
        "config": {"method": "DELETE", "url": "http://x/a"},
    }

    risk, reasons = risk_of(step)

    assert risk == Risk.CRITICAL
    assert reasons == ["DELETE is a destructive method: risk high → critical"]


def test_network_from_a_sandbox_is_at_least_high_and_says_so():
    capability = Capability(id="run_python", risk=Risk.LOW)

    risk, reasons = policy.step_risk(capability, RiskInputs(network=True))

    assert risk == Risk.HIGH
    assert reasons == ["network access from a sandbox: risk low → high"]


def test_a_delete_refused_at_a3_says_which_rule_raised_it(drive, target, path_for):
    path = path_for("delete")
    run = drive.start(drive.automation(definition(http_step("cleanup", target.url(path), "DELETE"))))

    assert run.status == "failed"
    assert run.error["code"] == "POLICY_VIOLATION"
    assert "DELETE is a destructive method: risk high → critical" in run.error["message"]
    assert target.count(path) == 0


def test_an_approval_says_which_rule_raised_the_risk(drive, target, path_for):
    run = drive.start(
        drive.automation(definition(risk_step("critical", target.url(path_for("a4"))), autonomy="A4"))
    )

    assert "DELETE is a destructive method: risk high → critical" in drive.approval(run).why
