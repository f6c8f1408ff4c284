"""Several processes starting at once on one fresh embedded broker file all get their queues.

kombu's SQLAlchemy transport creates its tables (``metadata.create_all``: look, then
CREATE TABLE) and a queue's ``kombu_queue`` row (SELECT, then INSERT) on first use. A
process doing that while another process does the same died at start: ``table kombu_queue
already exists``, or an IntegrityError on the queue's unique name, neither caught by
kombu. config.embedded_broker's Channel makes both race-free.

Each test makes the race certain rather than likely: it holds the broker file's write lock
with the winner's work done but not committed, starts the real processes (they look, see
nothing, and wait for the lock to write), and only then commits.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PROCESSES = 4

# Connects to the embedded broker, says so, then declares the queue and publishes to it.
_CHILD = """
import sys
import django; django.setup()
from config.celery import app
with app.connection_for_write() as conn:
    channel = conn.default_channel
    print("declaring", flush=True)
    channel.queue_declare(queue="race")
    channel.basic_publish(channel.prepare_message("x"), exchange="", routing_key="race")
print("ok", flush=True)
"""


def _env(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CELERY_BROKER_URL", "CELERY_RESULT_BACKEND")}
    env.update(AUTOPLANE_DATA_DIR=str(data_dir), DJANGO_SETTINGS_MODULE="config.settings")
    return env


def _child(data_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHILD], cwd=ROOT, env=_env(data_dir), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def _schema(tmp_path: Path) -> list[str]:
    """kombu's CREATE statements, as one process alone makes them on a broker file of its own."""
    alone = tmp_path / "alone"
    out, err = _child(alone).communicate(timeout=300)
    assert out.split() == ["declaring", "ok"], err
    with sqlite3.connect(alone / "broker.sqlite3") as db:
        return [
            sql
            for (sql,) in db.execute(
                "select sql from sqlite_master where sql is not null and name not like 'sqlite_%' order by rowid"
            )
        ]


def _race(data_dir: Path, winner: list[str], before: tuple[str, ...] | list[str] = ()) -> None:
    """Hold the write lock with ``winner`` executed, let PROCESSES processes reach the broker, then commit.

    ``before`` is committed first: what already existed when the processes started."""
    data_dir.mkdir()
    db = sqlite3.connect(data_dir / "broker.sqlite3", isolation_level=None)
    for sql in before:
        db.execute(sql)
    db.execute("begin immediate")
    for sql in winner:
        db.execute(sql)
    children = [_child(data_dir) for _ in range(PROCESSES)]
    for child in children:
        assert child.stdout.readline().split() == ["declaring"], child.communicate(timeout=300)[1]
    # They looked (nothing there: the winner has not committed) and now wait for the write
    # lock; the pause only lets the slowest of them get that far, it makes nothing pass.
    time.sleep(1.0)
    db.execute("commit")
    db.close()
    results = [child.communicate(timeout=300) for child in children]
    assert [(child.returncode, out.split()) for child, (out, _) in zip(children, results, strict=True)] == [
        (0, ["ok"])
    ] * PROCESSES, "\n".join(err[-1500:] for _, err in results)
    with sqlite3.connect(data_dir / "broker.sqlite3") as db:
        rows = db.execute(
            "select q.name, count(m.id) from kombu_queue q left join kombu_message m on m.queue_id = q.id "
            "group by q.name"
        ).fetchall()
    assert rows == [("race", PROCESSES)]


def test_processes_racing_to_create_the_broker_tables_all_start(tmp_path):
    _race(tmp_path / "broker", _schema(tmp_path))


def test_processes_racing_to_create_one_queue_row_all_start(tmp_path):
    _race(tmp_path / "broker", ["insert into kombu_queue (name) values ('race')"], before=_schema(tmp_path))
