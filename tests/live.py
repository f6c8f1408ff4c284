"""Real Celery processes for tests: workers and beat on the test database and broker.

Tests that use them must see committed data, so they run with
``transactional_db`` (the fixtures in ``tests/conftest.py`` take care of that).
Every process runs in its own process group, logs to ``<data dir>/logs/``, and
carries ``AUTOPLANE_TEST_SESSION`` in its environment so that whatever a test
leaves behind is found and killed at the end of the session.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

from config.celery import QUEUES

REPO = Path(__file__).resolve().parent.parent
SESSION_MARKER = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
MARKER_VAR = "AUTOPLANE_TEST_SESSION"
START_TIMEOUT = 60.0


def wait_for(predicate, timeout: float = 30.0, what: str = "condition", interval: float = 0.02):
    """Poll ``predicate`` until it returns something truthy (returned), or fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_run(run_id, statuses, timeout: float = 60.0):
    """The run once its status is one of ``statuses`` (read from the database), else fail saying where it is."""
    from automations.models import Run

    try:
        return wait_for(lambda: Run.objects.filter(pk=run_id, status__in=list(statuses)).first(), timeout=timeout,
                        what=f"run {run_id} to be one of {sorted(statuses)}")  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {Run.objects.get(pk=run_id).status}") from None


def database_url() -> str:
    """The URL of the database this test process is using right now (the test database)."""
    params = connection.settings_dict
    if connection.vendor == "sqlite":
        name = str(params["NAME"])
        if name == ":memory:" or name.startswith("file:"):
            raise RuntimeError("live worker tests need an on-disk SQLite test database")
        return f"sqlite:///{Path(name).resolve()}"
    user = quote(params.get("USER") or "", safe="")
    password = quote(params.get("PASSWORD") or "", safe="")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = params.get("HOST") or "localhost"
    port = f":{params['PORT']}" if params.get("PORT") else ""
    return f"postgres://{auth}{host}{port}/{params['NAME']}"


def live_worker_env(**overrides: str) -> dict[str, str]:
    """The environment a child process needs to use the same database and broker as this test process.

    Settings changed in-process (``override_settings``, ``settings`` fixture)
    do not reach the child; pass environment variables in ``overrides`` instead.
    """
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="tests.settings",
        DATABASE_URL=database_url(),
        CELERY_BROKER_URL=settings.CELERY_BROKER_URL,
        CELERY_RESULT_BACKEND=settings.CELERY_RESULT_BACKEND,
        AUTOPLANE_DATA_DIR=str(settings.DATA_DIR),
        PYTHONUNBUFFERED="1",
        **{MARKER_VAR: SESSION_MARKER},
    )
    env.update(overrides)
    return env


# --- /proc helpers (Linux) ---------------------------------------------------------


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # the command may contain spaces and parentheses


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children_of(pid: int) -> list[int]:
    return [p for p in _all_pids() if _ppid(p) == pid]


def descendants_of(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        kids = children_of(frontier.pop())
        found += kids
        frontier += kids
    return found


def pids_with_env(name: str, value: str) -> list[int]:
    """Processes whose environment has ``name=value`` (finds strays whatever their parent)."""
    needle = f"{name}={value}".encode()
    found = []
    for pid in _all_pids():
        if pid == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(pid)
    return found


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def is_alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# --- processes ----------------------------------------------------------------------

_started: list[LiveProcess] = []


class LiveProcess:
    """A child process in its own process group, with its output in a log file."""

    kind = "process"

    def __init__(self, argv: Sequence[str], *, name: str, env: dict[str, str] | None = None):
        self.name = name
        self.argv = list(argv)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(settings.DATA_DIR) / "logs" / f"{name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} was never started"
        return self.proc.pid

    def start(self, timeout: float = START_TIMEOUT):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, cwd=REPO, env=self.env or live_worker_env(), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        _started.append(self)
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Subclasses wait until the process does its job."""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pids(self) -> list[int]:
        """The main process and everything it forked that is still running."""
        if not self.alive():
            return []
        return [self.pid, *[p for p in descendants_of(self.pid) if is_alive(p)]]

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM (warm shutdown), then SIGKILL to the whole group after ``timeout`` seconds."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        return self.kill_all()

    def kill_all(self) -> int | None:
        """SIGKILL the main process and everything in its group, at once (a machine dying)."""
        if self.proc is None:
            return None
        self._signal_group(signal.SIGKILL)
        return self.proc.wait(10)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} pid={self.proc.pid if self.proc else None}>"


def _heartbeat_pid(name: str) -> int | None:
    from ops.models import Heartbeat

    return Heartbeat.objects.filter(name=name).values_list("pid", flat=True).first()


class WorkerProcess(LiveProcess):
    """``celery -A config worker`` consuming ``queues`` on the test database and broker."""

    kind = "worker"

    def __init__(
        self, queues: Sequence[str] = QUEUES, *, concurrency: int = 1, pool: str = "prefork",
        name: str | None = None, env: dict[str, str] | None = None, extra_args: Sequence[str] = (),
        include: Sequence[str] = ("tests.tasks",),
        flags: Sequence[str] = ("--without-gossip", "--without-mingle", "--without-heartbeat"),
    ):  # fmt: skip
        name = name or f"worker-{uuid.uuid4().hex[:6]}"
        self.queues = list(queues)
        self.concurrency = concurrency
        self.pool = pool
        argv = [
            sys.executable, "-m", "celery", "-A", "config", "worker", "-Q", ",".join(self.queues),
            "-n", f"{name}@%h", "-c", str(concurrency), "-P", pool, "-l", "INFO", *flags,
            *(["-I", ",".join(include)] if include else []), *extra_args,
        ]  # fmt: skip
        super().__init__(argv, name=name, env=env)

    @property
    def nodename(self) -> str:
        import socket

        return f"{self.name}@{socket.gethostname()}"

    def wait_ready(self, timeout: float) -> None:
        """Until the worker's heartbeat row (written on worker_ready, when it consumes) shows its pid."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if _heartbeat_pid(self.nodename) == self.pid:
                return
            time.sleep(0.05)
        self.kill_all()
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def pool_pids(self) -> list[int]:
        """The pool processes that execute tasks (prefork); empty for the solo pool."""
        if not self.alive():
            return []
        return [p for p in children_of(self.pid) if is_alive(p)]

    @property
    def sync_pool(self) -> bool:
        """True on a polling broker (the embedded one): Celery then runs a blocking pool, without its hub."""
        broker = (self.env or {}).get("CELERY_BROKER_URL") or settings.CELERY_BROKER_URL
        return not broker.startswith(("redis://", "rediss://", "amqp://", "amqps://", "pyamqp://"))

    def busy_pool_pids(self) -> list[int]:
        """Pool processes executing a task (marked from task_prerun to task_postrun, tests/tasks.py)."""
        from tests.tasks import busy_marker

        return [pid for pid in self.pool_pids() if busy_marker(pid).exists()]

    def kill_pool_children(self, sig: int = signal.SIGKILL) -> list[int]:
        """Kill the pool processes (like the OOM killer would) and return their pids; the main process
        replaces them.

        On the embedded broker the pool is billiard's blocking pool, whose
        children share one job pipe and one result pipe, each behind a lock: a
        child waiting for work holds the job pipe's read lock (and from just
        before it reads until just after), and a child that finished a task
        holds the result pipe's write lock while it sends the result. A SIGKILL
        to a child holding either deadlocks the whole pool for good (Redis
        workers give each child pipes of their own and are immune). So on that
        lane the children are frozen (SIGSTOP), and only those frozen while
        executing a task, which hold neither lock, are killed; the others,
        which hold no task and whose death would change nothing but the
        deadlock, are thawed unharmed.
        """
        children = self.pool_pids()
        if not self.sync_pool:
            victims = children
        else:
            for pid in children:
                _signal(pid, signal.SIGSTOP)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and not all(_state(p) in ("T", "Z", None) for p in children):
                time.sleep(0.005)
            frozen = {pid for pid in children if _state(pid) == "T"}  # one still running may be anywhere
            victims = [pid for pid in self.busy_pool_pids() if pid in frozen]
        for pid in victims:
            _signal(pid, sig)
        for pid in children:  # thaw the others; a stopped victim needs it to see a catchable signal
            _signal(pid, signal.SIGCONT)
        return victims

    def kill_pid(self, pid: int, sig: int = signal.SIGKILL) -> None:
        """Kill one pool process, e.g. the one a task reported executing it."""
        if pid not in self.pool_pids():
            raise ValueError(f"{pid} is not a pool process of {self.name}")
        os.kill(pid, sig)


class BeatProcess(LiveProcess):
    """``celery -A config beat`` with the database scheduler, on the test database and broker."""

    kind = "beat"

    def __init__(self, *, name: str | None = None, max_interval: int = 1, env: dict[str, str] | None = None):
        name = name or f"beat-{uuid.uuid4().hex[:6]}"
        argv = [
            sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "INFO",
            "-S", "django_celery_beat.schedulers:DatabaseScheduler", "--max-interval", str(max_interval),
        ]  # fmt: skip
        super().__init__(argv, name=name, env=env)

    def wait_ready(self, timeout: float) -> None:
        import socket

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            if _heartbeat_pid(f"beat@{socket.gethostname()}") == self.pid:
                return
            time.sleep(0.05)
        self.kill_all()
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s:\n{self.log_tail()}")


def running(kinds: Sequence[str] = ("worker", "beat")) -> list[LiveProcess]:
    """The processes of these kinds this session started that are still running."""
    return [process for process in dict.fromkeys(_started) if process.kind in kinds and process.alive()]


def kill_leftovers() -> list[int]:
    """SIGKILL every process this session started that is still around (groups first, then strays)."""
    for process in _started:
        if process.proc is not None:
            process._signal_group(signal.SIGKILL)
            try:
                process.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass
    strays = pids_with_env(MARKER_VAR, SESSION_MARKER)
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return strays


atexit.register(kill_leftovers)


class _Held(BaseHTTPRequestHandler):
    """Takes the request, then holds the answer for up to 60 s (or until the test releases it)."""

    def do_GET(self):
        self.server.arrived.set()
        self.server.release.wait(60)
        try:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        except OSError:  # the caller abandoned the call
            pass

    def log_message(self, *args):
        pass


class HeldServer(ThreadingHTTPServer):
    """A local HTTP server whose GETs are taken (``arrived`` is set), then answered only once
    ``release`` is set or 60 s have passed: a call in flight for a cancel to interrupt."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Held)
        self.arrived, self.release = threading.Event(), threading.Event()
        self.url = f"http://127.0.0.1:{self.server_address[1]}/slow"


@contextmanager
def held_server() -> Iterator[HeldServer]:
    """A running :class:`HeldServer`, whose held calls are released and which is closed at the end."""
    server = HeldServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()
