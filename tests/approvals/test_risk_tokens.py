"""Risk is raised by whole tokens only (SPEC §7.3): a step id is a label, and every raise says why."""

from __future__ import annotations

import pytest

from approvals import policy
from automations.definition import describe_step
from automations.steps import risk_for
from capabilities import mcp, registry
from capabilities.base import Capability, Risk, RiskInputs, SideEffect
from tests.factories import critical_step, definition, harvest_approved, http_step


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


def _http(method: str) -> dict:
    return {
        "step_id": "fetch_all",
        "action": "http_request",
        "config": {"method": method, "url": "http://x/"},
    }


def _email(count: int, cc: int = 0) -> dict:
    config = {"to": [f"p{i}@x.io" for i in range(count)], "subject": "s", "body": "b"}
    if cc:
        config["cc"] = [f"c{i}@x.io" for i in range(cc)]
    return {"step_id": "notify_everyone", "action": "send_email", "config": config}


# One fact raises the risk once, by one rule, with one explanation: the action describes the
# capability (an HTTP write, an email: medium) and the policy's rule alone raises it.
@pytest.mark.parametrize(
    ("step", "expected", "reasons"),
    [
        (_http("GET"), Risk.LOW, []),
        (_http("HEAD"), Risk.LOW, []),
        (_http("POST"), Risk.MEDIUM, []),
        (_http("PUT"), Risk.MEDIUM, []),
        (_http("PATCH"), Risk.MEDIUM, []),
        (_http("DELETE"), Risk.HIGH, ["DELETE is a destructive method: risk medium → high"]),
        (_http("delete"), Risk.HIGH, ["DELETE is a destructive method: risk medium → high"]),
        (_email(1), Risk.MEDIUM, []),
        (_email(10), Risk.MEDIUM, []),
        (_email(11), Risk.HIGH, ["an external write to 11 recipients (more than 10): risk medium → high"]),
        (
            _email(8, cc=3),
            Risk.HIGH,
            ["an external write to 11 recipients (more than 10): risk medium → high"],
        ),
        (_email(50), Risk.HIGH, ["an external write to 50 recipients (more than 10): risk medium → high"]),
    ],
    ids=lambda value: None if isinstance(value, dict) else str(value),
)
def test_one_fact_raises_the_risk_once_and_says_why(step, expected, reasons):
    assert risk_of(step) == (expected, reasons)


def test_network_from_a_sandbox_is_at_least_high_and_says_so():
    capability = Capability(id="run_python", risk=Risk.LOW)

    risk, reasons = policy.step_risk(capability, RiskInputs(network=True))

    assert risk == Risk.HIGH
    assert reasons == ["network access from a sandbox: risk low → high"]


def test_a_refusal_says_which_rule_raised_the_risk(request, drive, workspace, mcp_http):
    harvest_approved(
        mcp.mcp_server_create(workspace=workspace, slug="files", transport="http", url=mcp_http.url)
    )
    mcp_http.notes.write_text("keep me\n")
    run = drive.start(drive.automation(definition(critical_step("keep me"))))  # A3: critical is blocked

    assert run.status == "failed"
    assert run.error["code"] == "POLICY_VIOLATION"
    assert (
        "capability files.delete_note names a destructive verb (delete): risk high → critical"
        in (run.error["message"])
    )
    assert mcp_http.notes_written() == ["keep me"]


def test_an_approval_says_which_rule_raised_the_risk(drive, target, path_for):
    path = path_for("delete")
    run = drive.start(drive.automation(definition(http_step("cleanup", target.url(path), "DELETE"))))

    assert run.status == "awaiting_approval"  # A3: high asks a human
    assert drive.approval(run).why.count("→") == 1  # one fact, one raise
    assert "DELETE is a destructive method: risk medium → high" in drive.approval(run).why
    assert target.count(path) == 0
