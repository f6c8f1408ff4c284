"""Deployment hardening (issue 12, finding 6): a private data dir, and HTTPS settings from the environment."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLEAN_ENV = {k: v for k, v in os.environ.items()
             if not k.startswith(("DJANGO_", "AUTOPLANE_", "DATABASE_URL", "CELERY_"))}  # fmt: skip


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603 - our own interpreter and code
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**CLEAN_ENV, "DJANGO_SETTINGS_MODULE": "config.settings", **env},
    )  # fmt: skip


def test_the_data_dir_is_0700_and_its_files_0600(tmp_path):
    # given: a fresh data dir, under a permissive umask
    data = tmp_path / "data"
    code = (
        "import os; os.umask(0o022); import django; django.setup(); "
        "from django.db import connection; connection.ensure_connection(); "
        "connection.cursor().execute('CREATE TABLE t (x)')"
    )
    # when
    result = run(code, AUTOPLANE_DATA_DIR=str(data))
    # then
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = sorted(p for p in data.iterdir() if p.is_file())
    assert {p.name for p in files} >= {
        "autoplane.sqlite3",
        "broker.sqlite3",
        "results.sqlite3",
        "django_secret_key",
    }
    assert {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {p.name: "0o600" for p in files}


def test_an_existing_world_readable_data_dir_is_narrowed(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    (data / "autoplane.sqlite3").touch(mode=0o644)
    os.chmod(data / "autoplane.sqlite3", 0o644)
    result = run("import django; django.setup()", AUTOPLANE_DATA_DIR=str(data))
    assert result.returncode == 0, result.stderr
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    assert stat.S_IMODE((data / "autoplane.sqlite3").stat().st_mode) == 0o600


def test_https_settings_come_from_the_environment_and_satisfy_check_deploy(tmp_path):
    env = {
        "AUTOPLANE_DATA_DIR": str(tmp_path / "data"), "DJANGO_SECRET_KEY": "k" * 64,
        "DJANGO_SECURE_SSL_REDIRECT": "true", "DJANGO_SECURE_HSTS_SECONDS": "31536000",
        "DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS": "true", "DJANGO_SESSION_COOKIE_SECURE": "true",
        "DJANGO_CSRF_COOKIE_SECURE": "true", "DJANGO_SECURE_PROXY_SSL_HEADER": "true",
    }  # fmt: skip
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SECURE_HSTS_INCLUDE_SUBDOMAINS, "
        "s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_PROXY_SSL_HEADER)"
    )
    assert run(code, **env).stdout.split("\n")[0] == (
        "True 31536000 True True True ('HTTP_X_FORWARDED_PROTO', 'https')"
    )
    checked = run("import sys; from django.core.management import execute_from_command_line; "
                  "execute_from_command_line(['manage.py', 'check', '--deploy'])", **env)  # fmt: skip
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning not in checked.stdout + checked.stderr
    # and without them, check --deploy names each one
    unset = run("from django.core.management import execute_from_command_line; "
                "execute_from_command_line(['manage.py', 'check', '--deploy'])",
                AUTOPLANE_DATA_DIR=str(tmp_path / "data"), DJANGO_SECRET_KEY="k" * 64)  # fmt: skip
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in unset.stdout + unset.stderr
