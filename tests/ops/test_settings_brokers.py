"""Each broker gets a result backend that Celery can load, with no extra setting."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _result_backend(broker_url: str, tmp_path: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_RESULT_BACKEND", "DATABASE_URL")}
    env.update(
        CELERY_BROKER_URL=broker_url,
        AUTOPLANE_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="config.settings",
    )
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "from celery.app.backends import by_url; by_url(settings.CELERY_RESULT_BACKEND); "
        "print(settings.CELERY_RESULT_BACKEND)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("broker_url", "expected"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", "rpc://"),
        ("redis://127.0.0.1:6379/3", "redis://127.0.0.1:6379/3"),
    ],
)
def test_rabbitmq_and_redis_brokers_get_a_loadable_result_backend(broker_url, expected, tmp_path):
    assert _result_backend(broker_url, tmp_path) == expected
