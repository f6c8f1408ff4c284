from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from ops.supervisor import BACKOFF_MAX, SECOND_SIGNAL_AFTER, ChildSpec, Supervisor, child_health, read_state
from tests.live import REPO, descendants_of, is_alive

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


def test_a_crash_looping_child_is_restarted_forever_and_reported_while_the_others_keep_running(tmp_path):
    out = io.StringIO()
    state_file = tmp_path / "state.json"
    crasher = ChildSpec(
        "crasher", [sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"]
    )
    supervisor = Supervisor([ChildSpec("sleeper", SLEEPER), crasher], out=out, stop_timeout=1.0,
                            backoff_start=0.05, startup_grace=0.0, state_file=state_file)  # fmt: skip
    thread, result = _run_in_thread(supervisor)
    assert _wait(lambda: "sleeper" in supervisor.pids())
    sleeper = supervisor.pids()["sleeper"]

    assert _wait(lambda: (read_state(state_file) or {}).get("children", {}).get("crasher", {}).get("restarts", 0) >= 6,
                 timeout=30)  # fmt: skip
    assert thread.is_alive(), "the supervisor gave up"
    assert supervisor.pids()["sleeper"] == sleeper, "a crash-looping sibling stopped or restarted the others"
    state = read_state(state_file)["children"]
    assert child_health(state["sleeper"])["ok"]
    crashing = child_health(state["crasher"])
    assert not crashing["ok"]
    assert crashing["restarts"] >= 6
    restart_lines = [
        line for line in out.getvalue().splitlines() if "crasher exited with code 3; restart" in line
    ]
    assert len(restart_lines) >= 6  # one line per restart

    supervisor.stop()
    thread.join(15)
    assert result["code"] == 0
    assert not state_file.exists()


def test_the_backoff_is_capped_at_30_seconds():
    supervisor = Supervisor([ChildSpec("crasher", [sys.executable, "-c", "raise SystemExit(3)"])], out=io.StringIO(),
                            startup_grace=0.0)  # fmt: skip
    child = supervisor.children[0]
    delays = []
    for _ in range(10):
        supervisor._start(child)
        child.proc.wait()
        supervisor._check()
        delays.append(child.restart_at - time.monotonic())
        child.restart_at = 0.0
        child.old_group = None
    assert max(delays) <= BACKOFF_MAX
    assert delays[-1] > 20


def test_a_child_that_cannot_start_at_all_stops_everything_with_exit_1():
    out = io.StringIO()
    broken = ChildSpec("broken", [sys.executable, "-c", "raise SystemExit(3)"])
    supervisor = Supervisor([ChildSpec("sleeper", SLEEPER), broken], out=out, stop_timeout=1.0)
    thread, result = _run_in_thread(supervisor)
    thread.join(20)

    assert result["code"] == 1
    assert "broken could not start (exited with code 3" in out.getvalue()
    assert supervisor.pids() == {}


# Binds a port, forks a helper that inherits the listening socket (like gunicorn's workers), dies after a while.
PORT_HOLDER = """
import os, socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    sock.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    print("BIND FAILED", flush=True)
    raise SystemExit(9)
sock.listen()
print("bound", flush=True)
if os.fork() == 0:
    time.sleep(60)
time.sleep(0.3)
os._exit(1)
"""


def test_a_restarted_child_finds_the_port_its_predecessor_held(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = io.StringIO()
    web = ChildSpec("web", [sys.executable, "-c", PORT_HOLDER, str(port)])
    supervisor = Supervisor([web], out=out, stop_timeout=1.0, backoff_start=0.01, startup_grace=0.0)
    thread, result = _run_in_thread(supervisor)
    assert _wait(lambda: out.getvalue().count("| bound") >= 5, timeout=30)
    supervisor.stop()
    thread.join(15)
    assert "BIND FAILED" not in out.getvalue()


# A supervisor in a process of its own (signal handlers need the main thread), with one
# child that takes half a second to drain after SIGTERM and one that ignores it.
SUPERVISED = """
import sys
from ops.supervisor import ChildSpec, Supervisor

drainer = [sys.executable, "-c",
           "import signal, sys, time\\n"
           "signal.signal(signal.SIGTERM, lambda *a: (time.sleep(0.5), sys.exit(0)))\\n"
           "print('ready', flush=True)\\n"
           "while True: time.sleep(1)"]
children = [ChildSpec("drainer", drainer)]
if sys.argv[1] == "stubborn":
    children.append(ChildSpec("stubborn", [sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"]))
sys.exit(Supervisor(children, stop_timeout=30.0).run())
"""


def _start_supervised(kind: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED, kind], cwd=REPO, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    expected = 2 if kind == "stubborn" else 1
    ready = 0
    while ready < expected:
        line = process.stdout.readline()
        assert line, "the supervisor exited before its children were ready"
        ready += line.rstrip().endswith("| ready")
    return process


def test_one_signal_delivered_twice_at_once_still_drains_every_child():
    # Given: a supervisor without a terminal, like `setsid uv run manage.py up`
    process = _start_supervised("drainer")

    # When: SIGINT reaches it twice in a row (the group's copy, then a wrapper's forwarded copy)
    os.killpg(process.pid, signal.SIGINT)
    assert "stopping" in process.stdout.readline()
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=20)

    # Then: the child got its grace period and drained
    assert process.returncode == 0, output
    assert "drainer stopped" in output
    assert "killing it" not in output


def test_a_second_signal_a_second_later_skips_the_grace_period():
    # Given: a child that ignores SIGTERM and 30 s of grace
    process = _start_supervised("stubborn")
    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)
    assert "stopping" in process.stdout.readline()

    # When: a deliberate second Ctrl-C, SECOND_SIGNAL_AFTER later
    time.sleep(max(0.0, started + SECOND_SIGNAL_AFTER + 0.1 - time.monotonic()))
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=20)

    # Then: the stubborn child is killed at once instead of after 30 s
    assert process.returncode == 0, output
    assert "stubborn did not stop in time; killing it" in output
    assert time.monotonic() - started < 15
