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


def test_the_embedded_broker_polls_every_celery_polling_interval(tmp_path):
    """kombu's SQLAlchemy transport would poll once a second; config.embedded_broker's subclass
    (loaded by kombu on the first connection, not by the settings) polls as configured."""
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")}
    env.update(
        AUTOPLANE_DATA_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="config.settings",
        CELERY_POLLING_INTERVAL="0.03",
    )
    code = (
        "import django; django.setup(); from config.celery import app; "
        "conn = app.connection_for_write(); conn.ensure_connection(max_retries=0); "
        "channel = conn.default_channel; channel.queue_declare(queue='default'); "
        "print(type(conn.transport).__module__, conn.transport.polling_interval, "
        "channel.queue_declare(queue='default', passive=True).message_count)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip

    assert out.stdout.split() == ["config.embedded_broker", "0.03", "0"]
