from __future__ import annotations

import io
import sys
import threading
import time

from ops.supervisor import ChildSpec, Supervisor
from tests.live import descendants_of, is_alive

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# A parent that ignores SIGTERM and has a child of its own (like a pool).
STUBBORN = [
    sys.executable, "-c",
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
]  # fmt: skip


def _run_in_thread(supervisor: Supervisor) -> tuple[threading.Thread, dict]:
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(code=supervisor.run()), daemon=True)
    thread.start()
    return thread, result


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_child_that_exits_is_restarted_and_stop_leaves_nothing_running():
    out = io.StringIO()
    supervisor = Supervisor([ChildSpec("sleeper", SLEEPER), ChildSpec("stubborn", STUBBORN)], out=out,
                            stop_timeout=1.0, backoff_start=0.1)  # fmt: skip
    thread, result = _run_in_thread(supervisor)
    assert _wait(lambda: len(supervisor.pids()) == 2)
    first = supervisor.pids()["sleeper"]
    stubborn = supervisor.pids()["stubborn"]
    assert _wait(lambda: len(descendants_of(stubborn)) == 1)
    grandchild = descendants_of(stubborn)[0]

    supervisor.children[0].proc.kill()
    assert _wait(lambda: supervisor.pids().get("sleeper") not in (None, first))

    supervisor.stop()
    thread.join(15)
    assert result["code"] == 0
    assert _wait(lambda: not any(is_alive(pid) for pid in (first, stubborn, grandchild)), timeout=3)
    assert "stubborn did not stop in time" in out.getvalue()


def test_a_crash_looping_child_stops_everything_with_exit_1():
    out = io.StringIO()
    crasher = ChildSpec("crasher", [sys.executable, "-c", "raise SystemExit(3)"])
    supervisor = Supervisor([ChildSpec("sleeper", SLEEPER), crasher], out=out, stop_timeout=1.0,
                            backoff_start=0.05, crash_limit=3)  # fmt: skip
    thread, result = _run_in_thread(supervisor)
    thread.join(20)

    assert result["code"] == 1
    assert "crasher exited 3 times" in out.getvalue()
    assert supervisor.pids() == {}
