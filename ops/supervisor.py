"""A small process supervisor for ``manage.py up``: web, workers and beat on one machine.

Each child runs in its own session (so its own process group): a Ctrl-C in the
terminal reaches only the supervisor, which then stops the children in order,
and whatever a child forked (prefork pool processes, gunicorn workers) can be
killed with its group. Children's output is forwarded line by line, prefixed
with the child's name.

Policy when a child dies on its own: its process group is killed (no orphaned
pool processes) and it is restarted after a backoff (1 s, doubling, at most
30 s). A child that dies ``CRASH_LIMIT`` times within ``CRASH_WINDOW`` seconds is
crash-looping: the supervisor stops everything and exits 1, so a broken
configuration fails loudly instead of flapping forever.

On SIGINT or SIGTERM: SIGTERM to every child (warm shutdown: workers finish or
hand back their current task, gunicorn drains), up to ``stop_timeout`` seconds
of grace, then SIGKILL to every child's whole process group; exit 0. A second
signal skips the grace period. On Linux each child also gets
``PR_SET_PDEATHSIG=SIGTERM``, so even a supervisor killed with SIGKILL leaves
no child running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
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

CRASH_LIMIT = 5
CRASH_WINDOW = 120.0
BACKOFF_START = 1.0
BACKOFF_MAX = 30.0
POLL_SECONDS = 0.2


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
    crashes: deque[float] = field(default_factory=deque)
    reader: threading.Thread | None = None


_PR_SET_PDEATHSIG = 1
_libc = None
if sys.platform.startswith("linux"):
    # Loaded here, not in the child: between fork and exec only async-signal-safe work is wise.
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _set_parent_death_signal() -> None:
    """Runs in the child between fork and exec: die when the supervisor dies."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        stop_timeout: float = 10.0,
        out: TextIO | None = None,
        crash_limit: int = CRASH_LIMIT,
        crash_window: float = CRASH_WINDOW,
        backoff_start: float = BACKOFF_START,
    ):
        self.children = [_Child(spec, backoff=backoff_start) for spec in specs]
        self.stop_timeout = stop_timeout
        self.crash_limit = crash_limit
        self.crash_window = crash_window
        self.backoff_start = backoff_start
        self.out = out or sys.stdout
        self._out_lock = threading.Lock()
        self._stopping = threading.Event()
        self._signals = 0
        self._width = max((len(spec.name) for spec in specs), default=4)

    # --- output -----------------------------------------------------------
    def say(self, name: str, line: str) -> None:
        with self._out_lock:
            self.out.write(f"{name:<{self._width}} | {line.rstrip()}\n")
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
        child.started_at = time.monotonic()
        child.reader = threading.Thread(
            target=self._forward, args=(spec.name, child.proc.stdout), name=f"out:{spec.name}", daemon=True
        )
        child.reader.start()
        self.say("up", f"started {spec.name} (pid {child.proc.pid})")

    def pids(self) -> dict[str, int]:
        return {
            c.spec.name: c.proc.pid for c in self.children if c.proc is not None and c.proc.poll() is None
        }

    def _check(self) -> int | None:
        """Reap and restart children; returns an exit code when the supervisor must give up."""
        now = time.monotonic()
        for child in self.children:
            if child.proc is not None and child.restart_at is None:
                code = child.proc.poll()
                if code is None:
                    continue
                kill_group(child.proc.pid, signal.SIGKILL)  # whatever it forked dies with it
                if now - child.started_at > self.crash_window:
                    child.backoff = self.backoff_start  # it had been running fine: start the backoff over
                child.crashes.append(now)
                while child.crashes and now - child.crashes[0] > self.crash_window:
                    child.crashes.popleft()
                if len(child.crashes) >= self.crash_limit:
                    self.say("up", f"{child.spec.name} exited {len(child.crashes)} times in "
                                   f"{self.crash_window:.0f} s; giving up")  # fmt: skip
                    return 1
                self.say("up", f"{child.spec.name} exited with {code}; restarting in {child.backoff:g} s")
                child.restart_at = now + child.backoff
                child.backoff = min(child.backoff * 2, BACKOFF_MAX)
            elif child.restart_at is not None and now >= child.restart_at:
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

    def _on_signal(self, signum, frame) -> None:
        self._signals += 1
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
