"""``manage.py up`` end to end, on the lane's kind of database and broker.

Embedded lane: a fresh data directory (SQLite + SQLAlchemy broker in it).
PostgreSQL + Redis lane: a database of its own (the test database's name + ``_up``) and
another Redis db than the suite's, so the suite's shared worker cannot take
the pings meant for ``up``'s workers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from urllib.parse import urlparse, urlunparse

import pytest
from celery import Celery
from django.conf import settings
from django.db import connection

from config.celery import QUEUES
from tests.live import REPO, pids_with_env

MARKER = "AUTOPLANE_UP_TEST"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _postgres_admin():
    import psycopg

    params = connection.settings_dict
    return psycopg.connect(
        host=params.get("HOST") or "localhost", port=params.get("PORT") or 5432, user=params.get("USER") or None,
        password=params.get("PASSWORD") or None, dbname="postgres", autocommit=True,
    )  # fmt: skip


def _other_redis_db(url: str) -> str:
    """The lane's Redis database number + 8 (mod 16): its own, emptied before and after, and on a
    shared machine not another checkout's lane (each uses its own number: 0 → 8, 4 → 12, ...)."""
    parsed = urlparse(url)
    db = int(parsed.path.lstrip("/") or 0)
    return urlunparse(parsed._replace(path=f"/{(db + 8) % 16}"))


def _up_database() -> str:
    """A PostgreSQL database of this test run's own (named after its test database), dropped
    before and after: never another checkout's."""
    return f"{connection.settings_dict['NAME']}_up"


METRICS_TOKEN = "up-test-metrics-token-0123456789"


@pytest.fixture
def up_env(tmp_path):
    """Environment for a ``manage.py up`` child on the lane's database and broker, all its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_", "AUTOPLANE_"))}
    data_dir = tmp_path / "data"
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings", AUTOPLANE_DATA_DIR=str(data_dir), PYTHONUNBUFFERED="1",
        AUTOPLANE_METRICS_TOKEN=METRICS_TOKEN, **{MARKER: uuid.uuid4().hex},
    )  # fmt: skip
    broker_url = f"sqla+sqlite:///{data_dir / 'broker.sqlite3'}"
    backend_url = f"db+sqlite:///{data_dir / 'results.sqlite3'}"
    redis_client = None
    if not settings.BROKER_IS_EMBEDDED:
        import redis

        broker_url = backend_url = _other_redis_db(settings.CELERY_BROKER_URL)
        env.update(CELERY_BROKER_URL=broker_url, CELERY_RESULT_BACKEND=backend_url)
        redis_client = redis.Redis.from_url(broker_url)
        redis_client.flushdb()
    up_database = _up_database()
    if not settings.DATABASE_IS_SQLITE:
        with _postgres_admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {up_database} WITH (FORCE)")
            admin.execute(f"CREATE DATABASE {up_database}")
        params = connection.settings_dict
        auth = params.get("USER") or ""
        if params.get("PASSWORD"):
            auth += f":{params['PASSWORD']}"
        env["DATABASE_URL"] = (
            f"postgres://{auth}@{params.get('HOST') or 'localhost'}:{params.get('PORT') or 5432}/{up_database}"
        )
    yield {"env": env, "broker": broker_url, "backend": backend_url, "data_dir": data_dir}
    for pid in pids_with_env(MARKER, env[MARKER]):  # only if the test failed half-way
        os.kill(pid, signal.SIGKILL)
    if redis_client is not None:
        redis_client.flushdb()
    if not settings.DATABASE_IS_SQLITE:
        with _postgres_admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {up_database} WITH (FORCE)")


def _healthz(port: int) -> tuple[int, dict | None]:
    try:
        # the whole report, as an operator's monitoring reads it (an anonymous caller gets the status only)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/healthz",
                                         headers={"Authorization": f"Bearer {METRICS_TOKEN}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)
    except (urllib.error.URLError, OSError):
        return 0, None


@pytest.mark.workers
def test_up_gets_healthy_runs_tasks_on_every_queue_and_stops_without_leftovers(up_env, tmp_path, monkeypatch):
    port = _free_port()
    log_path = tmp_path / "up.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        up = subprocess.Popen(
            # The README's command: ./autoplane up, through `uv run`, in a session of its own (no terminal)
            [REPO / "autoplane", "up", "--port", str(port), "--concurrency", "1", "--web-workers", "2",
             "--stop-timeout", "60"],  # a busy machine may need more than 10 s to drain
            cwd=REPO, env=up_env["env"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        # Given: up reports healthy within the deadline
        status, body = 0, None
        deadline = started + 180
        while time.monotonic() < deadline and up.poll() is None:
            status, body = _healthz(port)
            if status == 200:
                break
            time.sleep(0.25)
        healthy_after = time.monotonic() - started
        log_text = log_path.read_text(errors="replace")
        assert status == 200, f"healthz {status} {body}\n{log_text[-4000:]}"
        print(f"\nmanage.py up healthy after {healthy_after:.1f} s")
        assert all(body["checks"]["queues"][queue]["workers"] >= 1 for queue in QUEUES)
        assert "login      admin / " in log_text

        # When: a ping is sent to each queue (Celery prefers these variables to its arguments)
        monkeypatch.setenv("CELERY_BROKER_URL", up_env["broker"])
        monkeypatch.setenv("CELERY_RESULT_BACKEND", up_env["backend"])
        app = Celery("uptest", broker=up_env["broker"], backend=up_env["backend"], set_as_current=False)
        marker_pids = set(pids_with_env(MARKER, up_env["env"][MARKER]))
        for queue in QUEUES:
            result = app.send_task("autoplane.ping", args=[queue], queue=queue).get(timeout=60, interval=0.05)

            # Then: a worker process of up's own executed it
            assert result["value"] == queue
            assert result["pid"] != os.getpid()
            assert result["pid"] in marker_pids or result["pid"] in pids_with_env(
                MARKER, up_env["env"][MARKER]
            )
        app.close()

        # When: SIGINT to the whole process group, as `kill -INT -PGID`, systemd or `timeout` do:
        # uv run gets it too and forwards its own copy to up
        os.killpg(up.pid, signal.SIGINT)

        # Then: every child drains (none is killed), exit 0, and no process of up's is left
        assert up.wait(timeout=60) == 0, log_path.read_text(errors="replace")[-4000:]
        log_text = log_path.read_text(errors="replace")
        assert "killing it" not in log_text, log_text[-4000:]
        for name in ("web", *(f"worker-{q.removeprefix('automations_')}" for q in QUEUES), "beat"):
            assert f"{name} stopped" in log_text, log_text[-4000:]
        deadline = time.monotonic() + 5
        while pids_with_env(MARKER, up_env["env"][MARKER]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids_with_env(MARKER, up_env["env"][MARKER]) == []
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(10)


WRITER = """
import sys
import django
django.setup()
from django.db import connection, transaction

proc = int(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()  # start together, or the writers would hardly overlap
for i in range(int(sys.argv[2])):
    # read-then-write: with DEFERRED transactions two of these deadlock on the
    # lock upgrade and SQLite answers "database is locked" without waiting.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT n FROM counter")
        n = cursor.fetchone()[0] + 1
        cursor.execute("UPDATE counter SET n = %s", [n])
        cursor.execute("INSERT INTO row (proc, i, seq) VALUES (%s, %s, %s)", [proc, i, n])
"""


def test_concurrent_processes_write_to_sqlite_without_database_is_locked(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    db_path = data_dir / "autoplane.sqlite3"
    with sqlite3.connect(db_path) as db:
        db.executescript(
            "PRAGMA journal_mode=WAL; CREATE TABLE counter (n INTEGER); INSERT INTO counter VALUES (0);"
            "CREATE TABLE row (proc INTEGER, i INTEGER, seq INTEGER UNIQUE);"
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_", "AUTOPLANE_"))}
    env.update(DJANGO_SETTINGS_MODULE="config.settings", AUTOPLANE_DATA_DIR=str(data_dir))
    processes, per_process = 4, 200

    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(n), str(per_process)],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        for n in range(processes)
    ]
    for writer in writers:
        assert writer.stdout.readline().strip() == b"ready", writer.stdout.read().decode(errors="replace")
    for writer in writers:
        writer.stdin.write(b"go\n")
        writer.stdin.flush()
    outputs = [(w.wait(timeout=240), w.stdout.read().decode(errors="replace")) for w in writers]

    assert [code for code, _ in outputs] == [0] * processes, "\n".join(out for _, out in outputs)
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT n FROM counter").fetchone()[0] == processes * per_process
        assert db.execute("SELECT count(*), count(DISTINCT seq) FROM row").fetchone() == (
            processes * per_process, processes * per_process,
        )  # fmt: skip


def test_up_creates_a_postgresql_database_that_does_not_exist_yet(tmp_path):
    if settings.DATABASE_IS_SQLITE:
        pytest.skip("PostgreSQL lane: SQLite creates its file anyway")
    name = f"autoplane_missing_{uuid.uuid4().hex[:8]}"
    params = connection.settings_dict
    auth = (params.get("USER") or "") + (f":{params['PASSWORD']}" if params.get("PASSWORD") else "")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "AUTOPLANE_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="config.settings", AUTOPLANE_DATA_DIR=str(tmp_path),
        DATABASE_URL=f"postgres://{auth}@{params.get('HOST') or 'localhost'}:{params.get('PORT') or 5432}/{name}",
    )  # fmt: skip
    try:
        # When: the README's PostgreSQL section is followed with a database nobody created
        done = subprocess.run([sys.executable, "manage.py", "up", "--init-only"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=300)  # fmt: skip

        # Then: up created it and went on, with no traceback
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"database '{name}' created" in done.stdout
        assert "Traceback" not in done.stderr
    finally:
        with _postgres_admin() as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
