"""Run retention: what must stay stays, batches are atomic and repeatable, the ledger still verifies."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from approvals.models import Approval
from audit import sequencer, writer
from audit.models import AuditEvent
from audit.verify import verify_chain
from automations import retention, services
from automations.models import DispatchKey, Run, RunStatus, StepRun
from tests.factories import definition, transform
from workspaces.services import workspace_get_or_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def ages(settings):
    settings.AUTOPLANE_RUN_RETENTION_DAYS = 30
    settings.AUTOPLANE_RUN_RETENTION_DAYS_BY_WORKSPACE = {"keep-all": 0}
    acme, keep_all = workspace_get_or_create(slug="acme"), workspace_get_or_create(slug="keep-all")
    automation = services.automation_create(
        workspace=acme, definition=definition(transform("a", 1)), user=None
    )
    other = services.automation_create(
        workspace=keep_all, definition=definition(transform("a", 1)), user=None
    )
    old, young = timezone.now() - timedelta(days=40), timezone.now() - timedelta(days=5)

    def runs(automation, n, status, when, finished=True):
        made = Run.objects.bulk_create(
            Run(workspace_id=automation.workspace_id, automation=automation, automation_version=1, snapshot={},
                status=status, trace_id=uuid.uuid4().hex, queue="automations_default")
            for _ in range(n)
        )  # fmt: skip
        ids = [r.pk for r in made]
        Run.objects.filter(pk__in=ids).update(created_at=when, finished_at=when if finished else None)
        StepRun.objects.bulk_create(
            StepRun(run_id=pk, index=i, step_id=f"s{i}", action="transform_data", status="succeeded",
                    output={"big": "x" * 100})
            for pk in ids for i in range(2)
        )  # fmt: skip
        return ids

    kinds = {
        "old_final": runs(automation, 3, RunStatus.SUCCEEDED, old)
        + runs(automation, 1, RunStatus.FAILED, old)
        + runs(automation, 1, RunStatus.CANCELLED, old),
        "old_active": runs(automation, 1, RunStatus.RUNNING, old, finished=False)
        + runs(automation, 1, RunStatus.AWAITING_APPROVAL, old, finished=False)
        + runs(automation, 1, RunStatus.NEEDS_ATTENTION, old),
        "young_final": runs(automation, 2, RunStatus.SUCCEEDED, young),
        "pending_approval": runs(automation, 1, RunStatus.FAILED, old),
        "other_workspace": runs(other, 2, RunStatus.SUCCEEDED, old),
    }
    Approval.objects.create(
        workspace=acme, run_id=kinds["pending_approval"][0], automation_id=automation.pk, step_key="plan:0:a",
        step_id="a", action="http_request", capability_id="core.http", risk="high", what={}, plan_hash="x",
        trace_id="t", expires_at=timezone.now() + timedelta(days=1),
    )  # fmt: skip
    return {"kinds": kinds, "acme": acme}


def _left(ids) -> int:
    return Run.objects.filter(pk__in=ids).count()


def test_only_finished_runs_past_the_window_are_pruned(ages):
    kinds = ages["kinds"]
    result = retention.history_prune(batch=2)
    assert result.runs == 5
    assert result.steps == 10
    assert result.batches == 3
    assert _left(kinds["old_final"]) == 0
    assert not StepRun.objects.filter(run_id__in=kinds["old_final"]).exists()
    for kept in ("old_active", "young_final", "pending_approval", "other_workspace"):
        assert _left(kinds[kept]) == len(kinds[kept]), kept
    assert StepRun.objects.count() == 2 * (Run.objects.count())
    # and each batch said what it did in the ledger
    rows = AuditEvent.objects.filter(type="history.pruned", workspace_id=ages["acme"].pk).order_by("id")
    assert [row.payload["runs"] for row in rows] == [2, 2, 1]
    assert all(row.payload["retention_days"] == 30 for row in rows)
    # a second pass finds nothing
    assert retention.history_prune(batch=2).runs == 0


def test_a_crash_mid_batch_undoes_that_batch_and_the_next_pass_finishes(ages, monkeypatch):
    kinds = ages["kinds"]
    append, calls = writer.append, []

    def crash_on_second_batch(**kwargs):
        calls.append(kwargs["type"])
        if len(calls) == 2:
            raise RuntimeError("worker killed")
        return append(**kwargs)

    monkeypatch.setattr(writer, "append", crash_on_second_batch)
    with pytest.raises(RuntimeError):
        retention.history_prune(batch=2)
    # the first batch is gone with its audit row; the second is whole again, steps included
    assert _left(kinds["old_final"]) == 3
    assert StepRun.objects.filter(run_id__in=kinds["old_final"]).count() == 6
    assert AuditEvent.objects.filter(type="history.pruned").count() == 1
    monkeypatch.setattr(writer, "append", append)
    assert retention.history_prune(batch=2).runs == 3
    assert _left(kinds["old_final"]) == 0
    assert sum(e.payload["runs"] for e in AuditEvent.objects.filter(type="history.pruned")) == 5


def test_the_ledger_verifies_after_a_prune(ages):
    retention.history_prune(batch=2)
    chain = writer.chain_for(ages["acme"].pk)
    sequencer.sequence_chain(chain)
    result = verify_chain(chain)
    assert result.ok, result.broken
    assert result.events >= 3


def test_no_retention_configured_prunes_nothing(ages, settings):
    settings.AUTOPLANE_RUN_RETENTION_DAYS = 0
    assert retention.history_prune().runs == 0
    assert _left(ages["kinds"]["old_final"]) == 5


def test_the_command_reports_and_can_stop_early(ages, capsys):
    call_command("prune_history", "--batch", "2", "--max-batches", "1")
    assert "2 runs and 4 steps pruned in 1 batches (stopped at --max-batches" in capsys.readouterr().out
    call_command("prune_history")
    out = capsys.readouterr().out
    assert "acme: 3 runs pruned" in out
    assert _left(ages["kinds"]["old_final"]) == 0


def test_a_pruned_run_takes_its_dispatch_keys_and_its_re_runs_keep_their_history(ages):
    kinds = ages["kinds"]
    pruned, kept = kinds["old_final"][0], kinds["young_final"][0]
    DispatchKey.objects.create(scope="t", key="k1", run_id=pruned, expires_at=timezone.now())
    DispatchKey.objects.create(scope="t", key="k2", run_id=kept, expires_at=timezone.now())
    Run.objects.filter(pk=kept).update(parent_run_id=pruned)
    Run.objects.filter(pk=kinds["old_final"][1]).update(parent_run_id=pruned)  # pruned in the same pass
    assert retention.history_prune(batch=2).runs == 5
    assert list(DispatchKey.objects.values_list("key", flat=True)) == ["k2"]
    assert Run.objects.get(pk=kept).parent_run_id is None
    assert StepRun.objects.filter(run_id=kept).count() == 2
    assert StepRun.objects.filter(run_id__in=kinds["old_final"]).count() == 0
