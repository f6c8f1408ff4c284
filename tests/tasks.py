"""Tasks that only test workers load (``WorkerProcess`` passes ``-I tests.tasks``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import shared_task


@shared_task(name="tests.sleep", ignore_result=False)
def sleep(seconds: float, pid_file: str | None = None) -> int:
    """Sleep in the pool process, first writing its pid to ``pid_file`` so a test can kill it mid-task."""
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    time.sleep(seconds)
    return os.getpid()


_connections: list[object] = []  # held, so that a closed connection's id() is never reused


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
