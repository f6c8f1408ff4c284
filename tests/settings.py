"""Settings for the test suite: config.settings with a data directory of its own.

The environment defaults are set before config.settings is imported, so the
tests never touch the developer's ./var, and so worker processes started by
the tests (DJANGO_SETTINGS_MODULE=tests.settings) read the same values.
Anything set in the environment wins (that is how the PostgreSQL + Redis lane
is chosen: DATABASE_URL and CELERY_BROKER_URL).
"""

from __future__ import annotations

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent

os.environ.setdefault("AUTOPLANE_DATA_DIR", str(_REPO / "var" / "test"))
# Short leases and sweeps so crash-recovery tests finish in seconds.
os.environ.setdefault("AUTOPLANE_RUN_LEASE_SECONDS", "5")
os.environ.setdefault("AUTOPLANE_SWEEP_SECONDS", "2")
# The suite (and the servers it starts) reads /healthz's checks anonymously; tests/ops/test_ops_access.py
# checks the default, private one.
os.environ.setdefault("AUTOPLANE_HEALTHZ_DETAILS", "public")
# The embedded broker polls its tables; poll often so tasks start promptly.
os.environ.setdefault("CELERY_POLLING_INTERVAL", "0.02")
# Tests on PostgreSQL generate the signing key in their data directory as the
# embedded setup does (workers inherit this environment and share the file).
os.environ.setdefault("AUTOPLANE_SIGNING_KEY_AUTOGENERATE", "true")

# The tests' local HTTP servers listen on loopback, which the egress deny-list closes to
# every workspace allowlist: only the deployment's allowlist may open it (docs/security.md).
os.environ.setdefault("AUTOPLANE_EGRESS_ALLOWLIST", "127.0.0.1")

from config.settings import *  # noqa: E402, F403

# Hashing passwords at full strength only slows the suite down.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
