"""The chaos suite (issue 18): real faults against a real ``manage.py up``.

``uv run pytest -m chaos`` runs every case (0-7) at full size (before a release).
``uv run pytest -m chaos_quick tests/chaos`` runs cases 0, 1, 2 and 5 at quick
sizes (a few minutes: ``.ci/run`` runs it on the PostgreSQL + Redis lane). A plain
``uv run pytest`` deselects the suite. The suite needs the
PostgreSQL + Redis lane (``DATABASE_URL=postgres://...``): it makes a database
of its own there (``<name>_chaos``) and starts a private ``redis-server``; the
embedded lane skips it.
"""

from __future__ import annotations

import os
import time

import pytest

from .platform import REPO, Platform, tools_missing


def _chaos_selected(config) -> bool:
    return "chaos" in (config.option.markexpr or "")


def pytest_collection_modifyitems(config, items):
    if _chaos_selected(config):
        return
    keep, drop = [], []
    for item in items:
        # Not in the normal run: the quick cases have a CI step of their own (-m chaos_quick).
        (drop if item.get_closest_marker("chaos") is not None else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="module")
def platform(request):
    missing = tools_missing()
    if missing:
        pytest.skip(f"the chaos suite needs {', '.join(missing)}")
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url.startswith(("postgres://", "postgresql://")):
        pytest.skip("the chaos suite runs on the PostgreSQL + Redis lane (DATABASE_URL=postgres://...)")
    # Kept after the run (var/ is not in git): up.log and the servers' logs explain a failure.
    directory = REPO / "var" / "chaos" / time.strftime("%Y%m%d-%H%M%S")
    directory.mkdir(parents=True, exist_ok=True)
    platform = Platform(directory, database_url)
    try:
        platform.start()
    except BaseException:
        platform.stop()
        raise
    yield platform
    platform.stop()
