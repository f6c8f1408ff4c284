"""seed_history: refuses a database that is not a test one; what it writes is real history whose ledger verifies."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.verify import verify_all
from automations.models import Run, StepRun
from bench import history_bench

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("command", [("seed_history", "--runs", "5"), ("bench", "--history", "5")])
def test_a_database_not_named_as_a_test_one_is_refused_without_the_flag(monkeypatch, command):
    monkeypatch.setitem(connection.settings_dict, "NAME", "autoplane")
    with pytest.raises(CommandError, match="--yes-this-is-a-test-database"):
        call_command(*command)
    assert not Run.objects.exists()


def test_seeded_runs_have_steps_and_chains_that_verify():
    history_bench.seed(30, chunk=7, out=lambda *_: None)  # several chunks, the last one short
    history_bench.seed(12, out=lambda *_: None)  # again: the same chains go on
    assert Run.objects.count() == 42
    assert StepRun.objects.count() == 84
    result = verify_all()
    assert result.ok, result.broken
    assert result.events >= 42 * 8
    runs = list(Run.objects.values_list("id", "trace_id"))
    assert all(run_id.version == 4 for run_id, _ in runs)  # ids and traces drawn from os.urandom
    assert len({trace for _, trace in runs}) == 42
    assert all(len(trace) == 32 and int(trace, 16) >= 0 for _, trace in runs)


def test_the_seed_reports_its_rate_and_cpu_per_run():
    lines = []
    result = history_bench.seed(10, out=lines.append)
    assert result["runs"] == 10
    assert result["runs_per_s"] > 0
    assert {"cpu_us_per_run_python", "cpu_us_per_run_postgres", "cpu_us_per_run_postgres_after"} <= set(
        result
    )
    assert any("CPU per run: Python" in line for line in lines)


postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="indexes are dropped on PostgreSQL only"
)


def _indexes() -> set[tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN"
            " ('automations_run', 'automations_steprun', 'audit_auditevent')"
        )
        return set(cursor.fetchall())


@postgresql_only
def test_a_seed_that_builds_the_indexes_after_leaves_them_as_they_were():
    before = _indexes()
    history_bench.seed(20, chunk=7, defer_indexes=True, out=lambda *_: None)
    assert _indexes() == before
    assert not history_bench.restore_indexes(out=lambda *_: None)  # nothing left to build
    assert Run.objects.count() == 20
    assert verify_all().ok


@postgresql_only
def test_a_seed_stopped_half_way_leaves_its_dropped_indexes_to_the_next_one(monkeypatch):
    before = _indexes()

    def dies(self, tables, chains):
        raise KeyboardInterrupt("killed mid-seed")

    monkeypatch.setattr(history_bench._Plan, "_flush", dies)
    with pytest.raises(KeyboardInterrupt):
        history_bench.seed(20, defer_indexes=True, out=lambda *_: None)
    left = before - _indexes()
    assert {name for name, _ in left} >= {
        "run_created_idx",
        "run_trace_idx",
        "audit_type_key_idx",
        "audit_run_ref_key_idx",
    }
    constraints = {name for name, _ in before if name.endswith("_pkey") or name == "steprun_unique"}
    assert not constraints & {name for name, _ in left}  # primary keys and unique constraints stay
    assert not {"run_active_lease_idx", "run_active_concurrency_idx"} & {name for name, _ in left}

    monkeypatch.undo()
    history_bench.seed(5, defer_indexes=False, out=lambda *_: None)  # builds them first
    assert _indexes() == before
    assert Run.objects.count() == 5
