"""Recorded runs as test cases, replayed through the real executor with no network (issue 34)."""

from __future__ import annotations

import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from automations.models import Run, RunStatus
from automations.services import automation_update
from tests.factories import client_for, definition, http_step, transform


def _call(*args: str) -> str:
    out = StringIO()
    call_command("automations", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def recorded(drive, people, http_server, tmp_path):
    """A run that fetched, shaped, was approved for a POST (A2: medium asks) and finished; its case file."""
    automation = drive.automation(definition(
        http_step("fetch", http_server.url + "/items/{{ inputs.id }}", output_as="fetch"),
        transform("shape", {"seen": "{{ fetch.status }}", "id": "{{ inputs.id }}"}, output_as="shaped"),
        {"step_id": "create_item", "action": "http_request",
         "config": {"method": "POST", "url": http_server.url + "/items", "json": {"id": "{{ shaped.id }}"}}},
        name="Sync Items", autonomy="A2",
        inputs_schema={"type": "object", "properties": {"id": {"type": "string"}}},
    ))  # fmt: skip
    run = drive.start(automation, {"id": "42"})
    assert run.status == RunStatus.AWAITING_APPROVAL
    drive.decide(drive.approval(run), people.alice)
    run = drive.resume(run)
    assert run.status == RunStatus.SUCCEEDED, run.error
    case_file = tmp_path / "sync-items.json"
    case_file.write_text(_call("record", str(run.pk)))
    return automation, run, case_file


def test_record_prints_the_case_and_the_api_gives_the_same(recorded, people):
    automation, run, case_file = recorded
    case = json.loads(case_file.read_text())
    assert case["automation"] == "sync-items"
    assert case["inputs"] == {"id": "42"}
    assert sorted(case["steps"]) == ["create_item", "fetch", "shape"]
    assert case["steps"]["create_item"]["config"]["json"] == {"id": "42"}
    assert case["approvals"] == [{"step_id": "create_item", "status": "approved"}]
    assert case["expect"]["status"] == "succeeded"
    response = client_for(people.viewer).get(f"/api/v1/runs/{run.pk}/test-case")
    assert response.status_code == 200
    assert response.json() == case
    active = Run.objects.create(workspace=automation.workspace, automation=automation, automation_version=1,
                                trace_id="x" * 32, queue="default", status=RunStatus.RUNNING)  # fmt: skip
    assert client_for(people.viewer).get(f"/api/v1/runs/{active.pk}/test-case").status_code == 409


def test_a_case_replays_without_network_and_writes_nothing(recorded, http_server, tmp_path):
    automation, run, case_file = recorded
    requests, runs = len(http_server.requests), Run.objects.count()
    report = tmp_path / "report.xml"
    out = _call("test", str(case_file), "--junit", str(report))
    assert "PASS  sync-items.json" in out
    assert len(http_server.requests) == requests  # the recorded outputs stood in for the calls
    assert Run.objects.count() == runs  # the replayed run was rolled back
    assert 'failures="0"' in report.read_text()


def test_an_edit_that_changes_a_rendered_config_fails_with_its_diff(recorded, people, tmp_path):
    automation, run, case_file = recorded
    changed = json.loads(json.dumps(automation.definition))
    changed["plan"][2]["config"]["json"] = {"id": "{{ shaped.id }}", "source": "sync"}
    automation_update(automation=automation, user=people.owner, definition=changed)
    report = tmp_path / "report.xml"
    with pytest.raises(CommandError, match="0 passed, 1 failed"):
        _call("test", str(tmp_path), "--junit", str(report))
    xml = report.read_text()
    assert 'failures="1"' in xml
    assert (
        "step &apos;create_item&apos; rendered config differs" in xml or "create_item' rendered config" in xml
    )
    assert '+    "source": "sync"' in xml


def test_a_hand_written_case_with_mocked_outputs(drive, people, tmp_path):
    drive.automation(definition(*(
        [{"step_id": "get", "action": "http_request", "output_as": "got",
          "config": {"method": "GET", "url": "https://api.example.invalid/x"}}]
        + [transform(f"t{i}", "{{ got.n }}") for i in range(9)]
    ), name="Ten Steps", autonomy="A3"))  # fmt: skip
    case = {"automation": "ten-steps", "workspace": "acme", "inputs": {},
            "steps": {"get": {"status": "succeeded", "output": {"n": 7}}},
            "expect": {"status": "succeeded"}}  # fmt: skip
    (tmp_path / "ten.json").write_text(json.dumps(case))
    started = time.perf_counter()
    out = _call("test", str(tmp_path / "ten.json"))
    assert time.perf_counter() - started < 5  # well under a second in practice; generous on a shared CPU
    assert "PASS  ten.json" in out
    (tmp_path / "ten.json").write_text(json.dumps({**case, "expect": {"status": "failed"}}))
    with pytest.raises(CommandError):
        _call("test", str(tmp_path / "ten.json"))
    (tmp_path / "ten.json").write_text(json.dumps({**case, "workspace": "elsewhere"}))
    assert "PASS  ten.json" in _call("test", str(tmp_path / "ten.json"), "--workspace", "acme")
    (tmp_path / "ten.json").write_text(json.dumps({**case, "automation": "nope"}))
    with pytest.raises(CommandError):
        _call("test", str(tmp_path / "ten.json"))


def test_a_new_step_changes_the_path_and_a_denial_replays_as_recorded(recorded, people, tmp_path):
    automation, run, case_file = recorded
    changed = json.loads(json.dumps(automation.definition))
    changed["plan"].insert(1, transform("extra", {"n": 1}))
    automation = automation_update(automation=automation, user=people.owner, definition=changed)
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("automations", "test", str(case_file), stdout=out)
    assert "the steps taken differs" in out.getvalue()
    assert '+  "extra",' in out.getvalue()
    # a hand-written case: the approval denied, the run fails at that step
    del changed["plan"][1]
    automation_update(automation=automation, user=people.owner, definition=changed)
    case = json.loads(case_file.read_text())
    case.pop("recorded_from")
    case["approvals"] = [{"step_id": "create_item", "status": "denied"}]
    case["steps"].pop("create_item")
    case["expect"] = {"status": "failed"}
    (tmp_path / "denied.json").write_text(json.dumps(case))
    assert "PASS  denied.json" in _call("test", str(tmp_path / "denied.json"))
