"""Worker processes for benchmarks: the same commands `manage.py up` runs, one group each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class Workers:
    def __init__(self, concurrency: dict[str, int]):
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Workers:
        log_dir = Path(os.environ.get("AUTOPLANE_DATA_DIR", REPO / "var")) / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        for queue, n in self.concurrency.items():
            argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", queue, "-n", f"bench-{queue}@%h",
                    "-c", str(n), "-P", "prefork", "-O", "fair", "-l", "WARNING",
                    "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
            log = open(log_dir / f"bench-{queue}.log", "ab")  # noqa: SIM115 - closed with the process
            self.procs.append(subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                               start_new_session=True))  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 60) -> None:
        from config.celery import ping

        deadline = time.monotonic() + timeout
        for queue in self.concurrency:
            while True:
                try:
                    ping.apply_async(queue=queue).get(timeout=5)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no worker answered on {queue}") from None

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
