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
