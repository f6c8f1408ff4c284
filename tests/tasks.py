"""Tasks that only test workers load (``WorkerProcess`` passes ``-I tests.tasks``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from celery import shared_task, signals
from django.conf import settings

from capabilities import registry
from capabilities.base import ActionDefinition, Capability


@shared_task(name="tests.sleep", ignore_result=False)
def sleep(seconds: float, pid_file: str | None = None) -> int:
    """Sleep in the pool process, first writing its pid to ``pid_file`` so a test can kill it mid-task."""
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


# --- which pool processes are executing a task (tests.live.WorkerProcess.kill_pool_children) ----
# A file per pool process while it runs a task, from task_prerun to task_postrun: in between it
# holds none of the pool's locks (the job pipe's read lock is released once its job is read, the
# result pipe's write lock is taken after task_postrun), so a kill -9 there cannot wedge the pool.
def busy_marker(pid: int) -> Path:
    return Path(settings.DATA_DIR) / "pool-busy" / str(pid)


def _mark_busy(**kwargs) -> None:
    marker = busy_marker(os.getpid())
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def _mark_idle(**kwargs) -> None:
    busy_marker(os.getpid()).unlink(missing_ok=True)


@signals.worker_process_init.connect(weak=False)
def _watch_tasks(**kwargs) -> None:
    """In each pool process of a test worker (not in the test process, which imports this module too)."""
    _mark_idle()  # a marker left by a killed process whose pid this one reuses
    signals.task_prerun.connect(_mark_busy, weak=False)
    signals.task_postrun.connect(_mark_idle, weak=False)


_connections: list[object] = []  # held, so that a closed connection's id() is never reused


@shared_task(name="tests.gc_state", ignore_result=False)
def gc_state() -> dict[str, int]:
    """This pool process's garbage collector: objects frozen out of its reach, and objects it tracks."""
    import gc

    return {"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects())}


@shared_task(name="tests.database_session", ignore_result=False)
def database_session() -> str:
    """Which database session this pool process used: PostgreSQL's backend pid, else the connection's identity."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
            return f"pg:{cursor.fetchone()[0]}"
        cursor.execute("SELECT 1")
    _connections.append(connection.connection)
    return f"{os.getpid()}:{id(connection.connection)}"


def _kill_own_process(ctx, config):
    os.kill(os.getpid(), signal.SIGKILL)  # kill -9 of the process running the step, mid-step
    raise AssertionError("unreachable")


# A quick step (no side effects, milliseconds) that kills its worker every time: the poison
# run of tests/automations/test_quick_step_crash.py. A worker registers it only when started
# with AUTOPLANE_TEST_CRASH_ACTION=1; the test process registers it for one test.
CRASH_ACTION = ActionDefinition(
    name="test_crash_worker",
    description="Test only: kill -9 the process that runs this step.",
    config_schema={"type": "object"},
    describe=lambda config: Capability(
        id="test_crash_worker", idempotent=True, expected_duration_seconds=0.01
    ),
    handler=_kill_own_process,
)


def register_crash_action() -> None:
    registry.ACTIONS[CRASH_ACTION.name] = "tests.tasks.CRASH_ACTION"
    registry.get_action.cache_clear()


def unregister_crash_action() -> None:
    registry.ACTIONS.pop(CRASH_ACTION.name, None)
    registry.get_action.cache_clear()


if os.environ.get("AUTOPLANE_TEST_CRASH_ACTION") == "1":
    register_crash_action()
