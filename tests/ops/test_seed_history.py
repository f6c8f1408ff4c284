"""seed_history: refuses a database that is not a test one; what it writes is real history whose ledger verifies."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from audit.verify import verify_all
from automations.models import Run, StepRun
from bench import history_bench

pytestmark = pytest.mark.django_db


def test_a_database_not_named_as_a_test_one_is_refused_without_the_flag(monkeypatch):
    monkeypatch.setitem(connection.settings_dict, "NAME", "autoplane")
    with pytest.raises(CommandError, match="--yes-this-is-a-test-database"):
        call_command("seed_history", "--runs", "5")
    assert not Run.objects.exists()


def test_seeded_runs_have_steps_and_chains_that_verify():
    history_bench.seed(30, chunk=7, out=lambda *_: None)  # several chunks, the last one short
    history_bench.seed(12, out=lambda *_: None)  # again: the same chains go on
    assert Run.objects.count() == 42
    assert StepRun.objects.count() == 84
    result = verify_all()
    assert result.ok, result.broken
    assert result.events >= 42 * 8
