"""A small process supervisor for ``manage.py up``: web, workers and beat on one machine.

Each child runs in its own session (so its own process group): a Ctrl-C in the
terminal reaches only the supervisor, which then stops the children in order,
and whatever a child forked (prefork pool processes, gunicorn workers) can be
killed with its group. Children's output is forwarded line by line, prefixed
with the child's name.

Policy when a child dies on its own: its process group is killed (no orphaned
pool processes), the supervisor waits for that group to be gone (so a restarted
web server finds its port free), and the child is restarted after a backoff
(1 s, doubling, at most 30 s; back to 1 s once it has run for ``HEALTHY_AFTER``
seconds). It is restarted forever: a crash-looping worker never stops web, beat
or the other queues. Each exit is one log line, and the supervisor keeps a state
file (``state_file``, JSON) that ``/healthz`` and ``/metrics`` read: a child that
is down, or exited ``FLAP_EXITS`` times within ``FLAP_WINDOW`` seconds, makes the
platform ``degraded`` under its own name, and every restart is counted.

The one exception is a child that cannot start at all: if a child's *first*
process exits on its own (not killed by a signal) within ``STARTUP_GRACE``
seconds, the configuration is broken; the supervisor stops everything and exits
1, so ``up`` fails loudly at start instead of flapping forever.

On SIGINT or SIGTERM: SIGTERM to every child (warm shutdown: workers finish or
hand back their current task, gunicorn drains), up to ``stop_timeout`` seconds
of grace, then SIGKILL to every child's whole process group; exit 0. A second
signal skips the grace period, but only when it comes at least
``SECOND_SIGNAL_AFTER`` seconds after the first: one Ctrl-C, or one
``kill -INT`` to the process group, often arrives twice at once (the terminal
or the killer signals the whole group, and a wrapper such as ``uv run``
forwards its copy too), and that must still drain gracefully. On Linux each child also gets
``PR_SET_PDEATHSIG=SIGTERM``, so even a supervisor killed with SIGKILL leaves
no child running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from config.logs import json_line

BACKOFF_START = 1.0
BACKOFF_MAX = 30.0
HEALTHY_AFTER = 60.0  # a child that ran this long starts its backoff over
STARTUP_GRACE = 10.0  # a first process exiting on its own this soon means the child cannot start
FLAP_WINDOW = 120.0  # a child with FLAP_EXITS exits in this window is reported as crash-looping
FLAP_EXITS = 3
GROUP_GONE_TIMEOUT = 10.0  # the longest a restart waits for the old process group to be gone
POLL_SECONDS = 0.2
SECOND_SIGNAL_AFTER = 1.0


@dataclass
class ChildSpec:
    name: str
    argv: Sequence[str]
    env: dict[str, str] | None = None
    cwd: str | None = None


@dataclass
class _Child:
    spec: ChildSpec
    proc: subprocess.Popen | None = None
    restart_at: float | None = None
    backoff: float = BACKOFF_START
    started_at: float = 0.0
    starts: int = 0
    restarts: int = 0
    exits: deque[float] = field(default_factory=deque)  # wall-clock times of recent exits
    last_exit: int | None = None
    old_group: int | None = None  # the previous process group, until it is gone
    group_gone_by: float = 0.0
    reader: threading.Thread | None = None


_PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    # Loaded here, not in the child: between fork and exec only async-signal-safe work is wise.
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _set_parent_death_signal() -> None:
    """Runs in the child between fork and exec: die when the supervisor dies."""
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def group_alive(pgid: int) -> bool:
    """Is any process of group ``pgid`` left? Reaps those that were orphaned to us (``up`` as PID 1)."""
    try:
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


def read_state(path: str | os.PathLike | None) -> dict | None:
    """The state file a supervisor writes, or None when there is none (not under ``up``)."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def child_health(child: dict, now: float | None = None) -> dict:
    """One child's entry for /healthz: ``ok`` unless it is down or crash-looping."""
    now = time.time() if now is None else now
    recent = sum(1 for at in child.get("exits", ()) if now - at <= FLAP_WINDOW)
    report = {
        "ok": child.get("state") == "running" and recent < FLAP_EXITS,
        "state": child.get("state"),
        "restarts": child.get("restarts", 0),
        "exits_last_window": recent,
    }
    if child.get("last_exit") is not None:
        report["last_exit"] = child["last_exit"]
    if not report["ok"]:
        report["error"] = (
            f"down, restarting in {max(0.0, child.get('restart_at', now) - now):.0f} s"
            if child.get("state") != "running"
            else f"crash-looping: exited {recent} times in {FLAP_WINDOW:.0f} s"
        )
    return report


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        stop_timeout: float = 10.0,
        out: TextIO | None = None,
        backoff_start: float = BACKOFF_START,
        startup_grace: float = STARTUP_GRACE,
        state_file: str | os.PathLike | None = None,
        json_lines: bool = False,
    ):
        self.json_lines = json_lines
        self.children = [_Child(spec, backoff=backoff_start) for spec in specs]
        self.stop_timeout = stop_timeout
        self.backoff_start = backoff_start
        self.startup_grace = startup_grace
        self.state_file = state_file
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self._stopping = threading.Event()
        self._signals = 0
        self._first_signal_at: float | None = None
        self._width = max((len(spec.name) for spec in specs), default=4)

    # --- output -----------------------------------------------------------
    def say(self, name: str, line: str) -> None:
        text = json_line(name, line) if self.json_lines else f"{name:<{self._width}} | {line.rstrip()}"
        with self._out_lock:
            self.out.write(f"{text}\n")
            self.out.flush()

    def _forward(self, name: str, stream) -> None:
        for raw in iter(stream.readline, b""):
            self.say(name, raw.decode(errors="replace"))
        stream.close()

    # --- children ---------------------------------------------------------
    def _start(self, child: _Child) -> None:
        spec = child.spec
        child.proc = subprocess.Popen(
            list(spec.argv),
            env=spec.env,
            cwd=spec.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_set_parent_death_signal if _libc is not None else None,
        )
        child.restart_at = None
        child.old_group = None
        child.started_at = time.monotonic()
        child.starts += 1
        child.reader = threading.Thread(
            target=self._forward, args=(spec.name, child.proc.stdout), name=f"out:{spec.name}", daemon=True
        )
        child.reader.start()
        if child.starts == 1:  # a restart was announced by its exit line
            self.say("up", f"started {spec.name} (pid {child.proc.pid})")
        self._write_state()

    def _write_state(self) -> None:
        """The children's state for /healthz and /metrics, replaced atomically."""
        if not self.state_file:
            return
        now_wall, now = time.time(), time.monotonic()
        children = {}
        for child in self.children:
            running = child.restart_at is None and child.old_group is None
            proc = child.proc if running else None
            children[child.spec.name] = {
                "state": "running" if proc is not None else "restarting",
                "pid": proc.pid if proc is not None else None,
                "restarts": child.restarts,
                "exits": list(child.exits),
                "last_exit": None if child.last_exit is None else describe_exit(child.last_exit),
                "restart_at": None if child.restart_at is None else now_wall + child.restart_at - now,
            }
        tmp = f"{self.state_file}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as handle:
                json.dump({"pid": os.getpid(), "updated_at": now_wall, "children": children}, handle)
            os.replace(tmp, self.state_file)
        except OSError as exc:
            self.say("up", f"cannot write the state file {self.state_file}: {exc}")

    def pids(self) -> dict[str, int]:
        return {
            c.spec.name: c.proc.pid for c in self.children if c.proc is not None and c.proc.poll() is None
        }

    def _check(self) -> int | None:
        """Reap and restart children; returns an exit code when a child cannot start at all."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                kill_group(child.proc.pid, signal.SIGKILL)  # whatever it forked dies with it
                ran = now - child.started_at
                if child.starts == 1 and code >= 0 and ran < self.startup_grace:
                    self.say("up", f"{child.spec.name} could not start (exited with {describe_exit(code)} "
                                   f"after {ran:.1f} s); stopping")  # fmt: skip
                    return 1
                if ran > HEALTHY_AFTER:
                    child.backoff = self.backoff_start  # it had been running fine: start the backoff over
                wall = time.time()
                child.exits.append(wall)
                while child.exits and wall - child.exits[0] > FLAP_WINDOW:
                    child.exits.popleft()
                child.restarts += 1
                child.last_exit = code
                child.old_group, child.group_gone_by = (
                    child.proc.pid,
                    now + child.backoff + GROUP_GONE_TIMEOUT,
                )
                child.restart_at = now + child.backoff
                self.say("up", f"{child.spec.name} exited with {describe_exit(code)}; restart {child.restarts} "
                               f"in {child.backoff:g} s ({len(child.exits)} exits in {FLAP_WINDOW:.0f} s)")  # fmt: skip
                child.backoff = min(child.backoff * 2, BACKOFF_MAX)
                self._write_state()
            elif child.restart_at is not None and now >= child.restart_at:
                if child.old_group is not None and group_alive(child.old_group):
                    if now < child.group_gone_by:
                        continue  # e.g. the old gunicorn workers still hold the port
                    self.say("up", f"{child.spec.name}: its old process group {child.old_group} is still "
                                   f"there after {GROUP_GONE_TIMEOUT:.0f} s; starting anyway")  # fmt: skip
                self._start(child)
        return None

    def _stop_all(self) -> None:
        running = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        for proc in running:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        started = time.monotonic()
        deadline = started + self.stop_timeout
        waiting = {c.spec.name: c.proc for c in self.children if c.proc in running}
        while waiting and time.monotonic() < deadline and self._signals < 2:
            for name, proc in list(waiting.items()):
                if proc.poll() is not None:
                    del waiting[name]
                    self.say("up", f"{name} stopped ({time.monotonic() - started:.1f} s)")
            time.sleep(0.05)
        for child in self.children:
            if child.proc is None:
                continue
            if child.proc.poll() is None:
                self.say("up", f"{child.spec.name} did not stop in time; killing it")
            kill_group(child.proc.pid, signal.SIGKILL)
            try:
                child.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.say("up", f"{child.spec.name} (pid {child.proc.pid}) survived SIGKILL")
        for child in self.children:
            if child.reader is not None:
                child.reader.join(timeout=1)
        if self.state_file:
            try:
                os.unlink(self.state_file)
            except OSError:
                pass

    def _on_signal(self, signum, frame) -> None:
        now = time.monotonic()
        if self._first_signal_at is None:
            self._first_signal_at = now
            self._signals = 1
        elif now - self._first_signal_at >= SECOND_SIGNAL_AFTER:
            self._signals = 2  # a deliberate second Ctrl-C: skip the grace period
        self._stopping.set()

    def stop(self) -> None:
        """Ask a running supervisor to stop (from another thread)."""
        self._stopping.set()

    def run(self) -> int:
        previous = {}
        if threading.current_thread() is threading.main_thread():  # else the caller stops it with stop()
            previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        code = 0
        try:
            for child in self.children:
                self._start(child)
            while not self._stopping.wait(POLL_SECONDS):
                failed = self._check()
                if failed is not None:
                    code = failed
                    break
            if code == 0:
                self.say("up", "stopping")
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.say("up", "stopped")
        return code
