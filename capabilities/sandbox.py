"""Run untrusted code (``run_python`` / ``run_shell`` steps) in a sandbox (SPEC §8).

Two backends share one interface:

* ``BubblewrapBackend`` (default, production): ``bwrap --unshare-all`` (no network
  unless the request asks for it), new user/pid/ipc/uts/cgroup namespaces, read-only
  ``/usr``, a synthesized minimal ``/etc``, fresh ``/proc``, ``/dev`` and size-capped
  tmpfs ``/tmp``, and a per-run host directory bound on ``/workspace``.
* ``SubprocessBackend``: rlimits, a wall timeout and a fresh cwd -- NO isolation at all.
  The code can read whatever the worker's (or ``nobody``'s) uid can read and can reach
  the network. DEVELOPMENT ONLY; it is chosen only by name, never as a fallback.

Resource limits are set by ``/usr/bin/prlimit`` (util-linux) as the first command
*inside* the sandbox, so they bind the user's code and not bwrap itself. A worker
running as root starts both backends as ``nobody`` (65534): the kernel never enforces
RLIMIT_NPROC for uid 0, and in bwrap's own user namespace the count is per sandbox.

``SandboxResult.error_code`` mapping:

* ``None`` -- exit status 0 (output may still be truncated: see ``*_truncated``).
* ``"TIMEOUT"`` -- wall-clock timeout (we killed it; ``violation="wall_time"``) or the
  CPU-seconds rlimit (SIGXCPU; ``violation="cpu_time"``).
* ``"SANDBOX_VIOLATION"`` -- a limit stopped the code; ``violation`` is one of
  ``memory`` (best effort: MemoryError/ENOMEM in stderr, or killed by SIGKILL/SIGSEGV),
  ``file_size``, ``processes``, ``open_files``, ``output`` (a stream passed twice
  ``max_output_bytes``: we kill the run) or ``sandbox_setup`` (bwrap itself failed).
* ``"INVALID_ARGUMENT"`` -- any other nonzero exit or signal: the user's code failed.

Limit detection reads the tail of stderr, so user code can fake a violation (that only
relabels its own failure). Exit statuses 129..192 read as "killed by signal N-128".
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Protocol

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
BASE_ENV: Mapping[str, str] = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/workspace",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TMPDIR": "/tmp",  # noqa: S108 -- the sandbox's own tmpfs
}
PRLIMIT = "/usr/bin/prlimit"
NOBODY = 65534
_FLOOD_FACTOR = 2  # kill the run once a stream passes this multiple of max_output_bytes
_TAIL_BYTES = 4096  # end of stderr kept for classifying failures even when truncated
_DRAIN_GRACE = 1.0  # seconds to keep reading after the main process exited

_MEMORY_MARKERS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
_PROCESS_MARKERS = (b"Resource temporarily unavailable", b"Cannot fork", b"can't fork")


@dataclass(frozen=True)
class SandboxRequest:
    argv: list[str]
    files: dict[str, bytes | str] = field(default_factory=dict)
    stdin: bytes = b""
    env: dict[str, str] = field(default_factory=dict)
    timeout_seconds: float = 30
    memory_mb: int = 256
    network: bool = False
    max_output_bytes: int = MiB
    max_processes: int = 64
    max_file_bytes: int = 64 * MiB
    max_open_files: int = 256
    cpu_seconds: int | None = None  # None: ceil(timeout_seconds) + 1
    # Set when the run is cancelled: the process group is killed at once (``CANCELLED``).
    cancelled: threading.Event | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not self.argv or not all(isinstance(a, str) and "\0" not in a for a in self.argv):
            raise ValueError("argv must be a non-empty list of strings without NUL")
        for name in self.files:
            _workspace_path(name)  # raises on absolute / ".." / empty names
        for key, value in self.env.items():
            if not key or "=" in key or "\0" in key or "\0" in value:
                raise ValueError(f"invalid environment variable name or value: {key!r}")
        numbers = (self.memory_mb, self.max_output_bytes, self.max_processes, self.max_file_bytes)
        if self.timeout_seconds <= 0 or min(numbers) <= 0 or self.max_open_files < 16:
            raise ValueError("timeouts and limits must be positive (max_open_files >= 16)")


@dataclass(frozen=True)
class SandboxResult:
    exit_code: int | None  # None when killed by a signal we saw directly or timed out
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    oom: bool
    signal: int | None
    duration_seconds: float
    error_code: str | None
    violation: str | None = None  # which limit, see the module docstring

    @property
    def ok(self) -> bool:
        return self.error_code is None


class SandboxUnavailable(Exception):
    """The backend cannot run here; callers fail the step closed with SANDBOX_VIOLATION."""


class SandboxBackend(Protocol):
    name: str

    def available(self) -> bool: ...

    def run(self, request: SandboxRequest) -> SandboxResult: ...


def _workspace_path(name: str) -> PurePosixPath:
    path = PurePosixPath(name)
    if not name or "\0" in name or path.is_absolute() or ".." in path.parts or path == PurePosixPath("."):
        raise ValueError(f"workspace file names must be relative and stay inside it: {name!r}")
    return path


def _limits_argv(request: SandboxRequest) -> list[str]:
    cpu = request.cpu_seconds or math.ceil(request.timeout_seconds) + 1
    return [
        PRLIMIT,
        f"--cpu={cpu}:{cpu + 1}",  # SIGXCPU at the soft limit, SIGKILL one second later
        f"--as={request.memory_mb * MiB}",
        f"--nproc={request.max_processes}",
        f"--nofile={request.max_open_files}",
        f"--fsize={request.max_file_bytes}",
        "--core=0",
        "--",
        *request.argv,
    ]


def _drop_to() -> int | None:
    """The host uid to run as: ``nobody`` when we are root (see module docstring)."""
    return NOBODY if os.geteuid() == 0 else None


class _RunDir:
    """A private per-run host directory: ``workspace/`` (bound on /workspace) and ``etc/``."""

    def __init__(self, request: SandboxRequest, owner: int | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="autoplane-sandbox-"))  # mode 0700
        self.workspace, self.etc = self.root / "workspace", self.root / "etc"
        try:
            self.workspace.mkdir(mode=0o700)
            self.etc.mkdir(mode=0o755)
            for name, content in request.files.items():
                target = self.workspace / _workspace_path(name)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content.encode() if isinstance(content, str) else content)
            if owner is not None:
                for path in [self.root, self.workspace, *self.workspace.rglob("*")]:
                    os.chown(path, owner, owner, follow_symlinks=False)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        # User code may leave directories without permissions; make them removable
        # without ever following a symlink it planted.
        for parent, dirs, _files in os.walk(self.root):
            for name in dirs:
                path = os.path.join(parent, name)
                if not os.path.islink(path):
                    os.chmod(path, 0o700)
        shutil.rmtree(self.root, ignore_errors=True)


class _Stream:
    def __init__(self, cap: int) -> None:
        self.cap, self.total, self.head, self.tail = cap, 0, bytearray(), b""

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if len(self.head) < self.cap:
            self.head += chunk[: self.cap - len(self.head)]
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _execute(
    argv: list[str],
    *,
    request: SandboxRequest,
    cwd: Path,
    env: Mapping[str, str],
    kind: str,
    pass_fds: tuple[int, ...] = (),
) -> SandboxResult:
    """Start ``argv`` in its own process group, collect capped output, enforce the wall clock."""
    owner = _drop_to()
    started = time.monotonic()
    deadline = started + request.timeout_seconds
    with tempfile.TemporaryFile() as stdin:  # a file, not a pipe: no writer thread, no deadlock
        stdin.write(request.stdin)
        stdin.seek(0)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,  # its own process group: one killpg reaches every child
                pass_fds=pass_fds,
                user=owner,
                group=owner,
                extra_groups=None if owner is None else [],
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start the {kind} sandbox: {exc}") from exc
    out, err = _Stream(request.max_output_bytes), _Stream(request.max_output_bytes)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}  # type: ignore[union-attr]
    timed_out = flooded = cancelled = False
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector, proc:
        for fd in streams:
            selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if proc.poll() is not None:
                if exited_at is None:
                    exited_at = now
                    _kill_group(proc)  # background children must not outlive the step
                if not selector.get_map() or now - exited_at > _DRAIN_GRACE:
                    break
            elif now >= deadline and not (timed_out or flooded or cancelled):
                timed_out = True
                _kill_group(proc)
            elif (
                request.cancelled is not None
                and request.cancelled.is_set()
                and not (timed_out or flooded or cancelled)
            ):
                cancelled = True
                _kill_group(proc)
            if not selector.get_map():
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
                continue
            for key, _events in selector.select(timeout=0.1):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                stream = streams[key.fd]
                stream.feed(chunk)
                if stream.total > _FLOOD_FACTOR * stream.cap and not (flooded or timed_out):
                    flooded = True
                    _kill_group(proc)
    if cancelled:
        return _cancelled_result(out, err, time.monotonic() - started)
    return _result(proc.returncode, out, err, timed_out, flooded, time.monotonic() - started, kind)


def _cancelled_result(out: _Stream, err: _Stream, duration: float) -> SandboxResult:
    return SandboxResult(
        exit_code=None, stdout=bytes(out.head), stderr=bytes(err.head), stdout_truncated=out.total > out.cap,
        stderr_truncated=err.total > err.cap, timed_out=False, oom=False, signal=signal.SIGKILL,
        duration_seconds=duration, error_code="CANCELLED", violation="cancelled",
    )  # fmt: skip


def _result(
    rc: int, out: _Stream, err: _Stream, timed_out: bool, flooded: bool, duration: float, kind: str
) -> SandboxResult:
    sig = -rc if rc < 0 else (rc - 128 if 128 < rc <= 128 + 64 else None)
    tail = err.tail
    violation: str | None = None
    if timed_out:
        code, violation = "TIMEOUT", "wall_time"
    elif flooded:
        code, violation = "SANDBOX_VIOLATION", "output"
    elif rc == 0:
        code = None
    elif sig == signal.SIGXCPU:
        code, violation = "TIMEOUT", "cpu_time"
    elif sig == signal.SIGXFSZ or b"File too large" in tail:
        code, violation = "SANDBOX_VIOLATION", "file_size"
    elif sig in (signal.SIGKILL, signal.SIGSEGV) or any(m in tail for m in _MEMORY_MARKERS):
        code, violation = "SANDBOX_VIOLATION", "memory"
    elif any(m in tail for m in _PROCESS_MARKERS):
        code, violation = "SANDBOX_VIOLATION", "processes"
    elif b"Too many open files" in tail:
        code, violation = "SANDBOX_VIOLATION", "open_files"
    elif kind == "bubblewrap" and rc == 1 and err.head.startswith(b"bwrap: ") and not out.total:
        code, violation = "SANDBOX_VIOLATION", "sandbox_setup"
    else:
        code = "INVALID_ARGUMENT"
    return SandboxResult(
        exit_code=None if rc < 0 or timed_out else rc,
        stdout=bytes(out.head),
        stderr=bytes(err.head),
        stdout_truncated=out.total > out.cap,
        stderr_truncated=err.total > err.cap,
        timed_out=timed_out,
        oom=violation == "memory",
        signal=sig,
        duration_seconds=duration,
        error_code=code,
        violation=violation,
    )


_PROBED: set[tuple[str, int | None]] = set()


def _etc_files(uid: int) -> dict[str, str]:
    """A synthesized /etc: just enough for ``id``, ``getpwuid`` and ``localhost``."""
    return {
        "passwd": f"root:x:0:0:root:/nonexistent:/usr/sbin/nologin\nsandbox:x:{uid}:{uid}::/workspace:/bin/sh\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
    }


class BubblewrapBackend:
    """Production backend: bubblewrap >= 0.8 (Debian 12: ``apt-get install bubblewrap``).

    ``network=True`` shares the *host* network namespace, loopback services (PostgreSQL,
    Redis) included: grant it only behind an egress policy. Call ``run`` from a thread
    that outlives the run: ``--die-with-parent`` is tied to the calling thread.
    """

    name = "bubblewrap"
    sandbox_uid = NOBODY
    system_dirs = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
    etc_binds = ("ld.so.cache", "alternatives", "localtime", "ssl/certs", "ssl/openssl.cnf")

    def __init__(self, bwrap: str = "bwrap") -> None:
        self.bwrap = bwrap

    def available(self) -> bool:
        path = shutil.which(self.bwrap)
        if path is None or not os.access(PRLIMIT, os.X_OK):
            return False
        key = (path, _drop_to())
        if key not in _PROBED:  # one real start per process: user namespaces may be denied
            try:
                probe = self.run(SandboxRequest(argv=["/bin/true"], timeout_seconds=10))
            except SandboxUnavailable:
                return False
            if probe.exit_code != 0:
                logger.warning("bubblewrap probe failed: %r", probe.stderr[-500:])
                return False
            _PROBED.add(key)
        return True

    def argv(self, request: SandboxRequest, run_dir: _RunDir, info_fd: int | None = None) -> list[str]:
        args = [shutil.which(self.bwrap) or self.bwrap, "--unshare-all"]
        if info_fd is not None:
            args += ["--info-fd", str(info_fd)]
        if request.network:
            args.append("--share-net")
        uid = str(self.sandbox_uid)
        args += ["--unshare-user", "--uid", uid, "--gid", uid, "--disable-userns", "--cap-drop", "ALL"]
        args += ["--die-with-parent", "--new-session", "--hostname", "sandbox"]
        args += ["--ro-bind", "/usr", "/usr"]
        for name in self.system_dirs:  # merged-/usr symlinks, or real dirs on older layouts
            host = f"/{name}"
            if os.path.islink(host):
                args += ["--symlink", os.readlink(host), host]
            elif os.path.isdir(host):
                args += ["--ro-bind", host, host]
        for name in self.etc_binds:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        for name, content in _etc_files(self.sandbox_uid).items():
            (run_dir.etc / name).write_text(content)
            args += ["--ro-bind", str(run_dir.etc / name), f"/etc/{name}"]
        if request.network:
            args += ["--ro-bind-try", "/etc/resolv.conf", "/etc/resolv.conf"]
        tmpfs_size = str(request.memory_mb * MiB)  # tmpfs lives in RAM: bound it like memory
        args += ["--proc", "/proc", "--dev", "/dev"]
        for tmpfs in ("/tmp", "/dev/shm"):  # noqa: S108 -- fresh, private tmpfs mounts
            args += ["--size", tmpfs_size, "--tmpfs", tmpfs]
        for path, is_dir in _worker_private_paths(bound=self._bound_roots()):
            # The worker's own files (data dir, keys, the project) never show through a system bind.
            args += ["--tmpfs", path] if is_dir else ["--ro-bind", "/dev/null", path]
        args += ["--bind", str(run_dir.workspace), "/workspace", "--chdir", "/workspace"]
        args += ["--remount-ro", "/dev", "--remount-ro", "/"]  # only /workspace and the tmpfs stay writable
        args.append("--clearenv")
        for key, value in {**BASE_ENV, **request.env}.items():
            args += ["--setenv", key, value]
        return [*args, "--", *_limits_argv(request)]

    def _bound_roots(self) -> list[str]:
        roots = ["/usr", *(f"/{name}" for name in self.system_dirs if not os.path.islink(f"/{name}"))]
        return roots + [f"/etc/{name}" for name in self.etc_binds]

    def run(self, request: SandboxRequest) -> SandboxResult:
        run_dir = _RunDir(request, owner=_drop_to())
        info_r, info_w = os.pipe()
        try:
            argv = self.argv(request, run_dir, info_fd=info_w)
            fds = (info_w,)
            result = _execute(argv, request=request, cwd=run_dir.root, env={}, kind=self.name, pass_fds=fds)
            _wait_for_pid_namespace(info_r)
            return result
        finally:
            os.close(info_r)
            os.close(info_w)
            run_dir.remove()


def _wait_for_pid_namespace(info_fd: int, timeout: float = 2.0) -> None:
    """Wait until the sandbox's init (its host pid comes from ``--info-fd``) has exited.

    bwrap's outer process exits as soon as its init *reports* the exit status; the init
    is still exiting, and the kernel kills the rest of the pid namespace as part of that
    exit. Once the init is a zombie (or gone), every sandbox process is gone.
    """
    os.set_blocking(info_fd, False)
    try:
        init_pid = json.loads(os.read(info_fd, 65536) or b"{}").get("child-pid")
    except (BlockingIOError, ValueError, AttributeError):
        return  # killed before the sandbox started
    if not isinstance(init_pid, int):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{init_pid}/stat").read_text()
        except OSError:
            return
        if stat.rpartition(")")[2].split()[0] in ("Z", "X"):
            return
        time.sleep(0.002)
    logger.warning("sandbox init %s still running %.1fs after bwrap exited", init_pid, timeout)


def _worker_private_paths(bound: list[str]) -> list[tuple[str, bool]]:
    """The worker's private paths (its data dir, signing key file, the project directory) that
    lie under one of the ``bound`` host trees, as (path, is_dir): those the sandbox must hide."""
    try:
        from django.conf import settings
    except ImportError:
        return []
    if not settings.configured:
        return []
    candidates = [settings.DATA_DIR, settings.AUTOPLANE_SIGNING_KEY_FILE, settings.BASE_DIR]
    found: list[tuple[str, bool]] = []
    for candidate in candidates:
        try:
            path = Path(candidate).resolve()
        except (OSError, TypeError, ValueError):
            continue
        if not path.exists() or not any(path.is_relative_to(Path(root).resolve()) for root in bound):
            continue
        found.append((str(path), path.is_dir()))
    return found


class SubprocessBackend:
    """DEVELOPMENT ONLY: rlimits + wall timeout + fresh cwd + minimal env, NO isolation.

    The code sees the host filesystem and network with the worker's uid (``nobody`` if
    the worker is root), and a child that calls setsid() can outlive the step.
    """

    name = "subprocess"

    def available(self) -> bool:
        return os.name == "posix" and os.access(PRLIMIT, os.X_OK)

    def run(self, request: SandboxRequest) -> SandboxResult:
        logger.warning("running sandbox step with the UNISOLATED subprocess backend (development only)")
        run_dir = _RunDir(request, owner=_drop_to())
        try:
            workspace = str(run_dir.workspace)
            env = {**BASE_ENV, "HOME": workspace, "TMPDIR": workspace, **request.env}
            argv = _limits_argv(request)
            return _execute(argv, request=request, cwd=run_dir.workspace, env=env, kind=self.name)
        finally:
            run_dir.remove()


_BACKENDS: dict[str, type[BubblewrapBackend] | type[SubprocessBackend]] = {
    "bubblewrap": BubblewrapBackend,
    "subprocess": SubprocessBackend,
}


def get_backend(name: str) -> SandboxBackend:
    try:
        return _BACKENDS[name]()
    except KeyError:
        raise ValueError(f"unknown sandbox backend {name!r}; choose one of {sorted(_BACKENDS)}")


def backend_from_settings() -> SandboxBackend:
    """``settings.AUTOPLANE_SANDBOX_BACKEND`` (default ``bubblewrap``) and, for bubblewrap,
    ``settings.AUTOPLANE_BWRAP_PATH`` (default ``bwrap`` on ``PATH``); Django is optional."""
    name = "bubblewrap"
    try:
        from django.conf import settings
    except ImportError:
        return get_backend(name)
    if not settings.configured:
        return get_backend(name)
    name = settings.AUTOPLANE_SANDBOX_BACKEND
    if name == "subprocess" and not settings.AUTOPLANE_SANDBOX_INSECURE:
        raise SandboxUnavailable(
            "AUTOPLANE_SANDBOX_BACKEND=subprocess runs code unisolated; it needs AUTOPLANE_SANDBOX_INSECURE=true"
        )
    if name == "bubblewrap":
        return BubblewrapBackend(bwrap=settings.AUTOPLANE_BWRAP_PATH or "bwrap")
    return get_backend(name)


def run_sandboxed(request: SandboxRequest, backend: SandboxBackend | None = None) -> SandboxResult:
    """Run ``request``; raise ``SandboxUnavailable`` rather than fall back to another backend."""
    backend = backend if backend is not None else backend_from_settings()
    if not backend.available():
        raise SandboxUnavailable(f"sandbox backend {backend.name!r} is not available on this host")
    return backend.run(request)
