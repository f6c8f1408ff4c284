"""`manage.py bench` on a fresh database migrates it first, as `up` does (it used to stop with
a traceback: relation "workspaces_workspace" does not exist)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_bench_on_a_fresh_database_migrates_it_first(tmp_path):
    # A fresh embedded data directory: an empty SQLite database (the quickest fresh database to
    # make; PostgreSQL goes through the same prepare_database as `up`).
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL",
                                                            "CELERY_RESULT_BACKEND")}  # fmt: skip
    env.update(AUTOPLANE_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="config.settings")
    out = subprocess.run([sys.executable, "manage.py", "bench", "--profile", "-n", "1"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip

    assert out.returncode == 0, out.stderr[-3000:]
    assert "bench: applying migrations" in out.stdout
    assert "summary: fire_statements=" in out.stdout
    assert "Traceback" not in out.stderr
