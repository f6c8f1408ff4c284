"""Escape and exhaustion tests for the sandbox runner (SPEC §8).

Real bubblewrap, no mocks. Every hostile payload reports what it tried as JSON on
its last stdout line, so a failure says exactly which door was open.
"""

from __future__ import annotations

import errno
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from capabilities.sandbox import (
    BASE_ENV,
    BubblewrapBackend,
    SandboxBackend,
    SandboxRequest,
    SandboxResult,
    SandboxUnavailable,
    SubprocessBackend,
    backend_from_settings,
    get_backend,
    run_sandboxed,
)

PROJECT = Path(__file__).resolve().parents[2]
BWRAP_AVAILABLE = BubblewrapBackend().available()
SLACK = 2.0  # seconds allowed beyond a timeout for killing and reaping

# Prepended to hostile payloads: attempt(fn) -> {"ok": ..., "value"/"errno": ...}
PROBE = """\
import json, os, socket, sys

def attempt(fn):
    try:
        return {"ok": True, "value": fn()}
    except OSError as exc:
        return {"ok": False, "errno": exc.errno, "error": type(exc).__name__}
"""


@pytest.fixture
def bwrap() -> BubblewrapBackend:
    if not BWRAP_AVAILABLE:
        pytest.skip("bubblewrap cannot start a sandbox here (apt-get install bubblewrap; user namespaces)")
    return BubblewrapBackend()


def run_python(backend: SandboxBackend, code: str, *, name: str = "main.py", **kwargs) -> SandboxResult:
    files = {name: PROBE + textwrap.dedent(code)}
    return run_sandboxed(SandboxRequest(argv=["python3", "-I", name], files=files, **kwargs), backend)


def last_json(result: SandboxResult) -> dict:
    assert result.stdout, f"no output; stderr={result.stderr[-2000:]!r}"
    return json.loads(result.stdout.splitlines()[-1])


def host_pids_matching(marker: str) -> list[str]:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    return found.stdout.split()


# --- what a step is supposed to be able to do --------------------------------------------


def test_python_step_reads_json_stdin_and_prints_json_last_line(bwrap):
    code = """
        data = json.load(sys.stdin)
        print("some log line")
        print(json.dumps({"total": sum(data["numbers"]), "cwd": os.getcwd(), "uid": os.getuid()}))
    """
    result = run_python(bwrap, code, stdin=b'{"numbers": [1, 2, 3]}')

    assert result.error_code is None, result.stderr
    assert result.exit_code == 0
    assert last_json(result) == {"total": 6, "cwd": "/workspace", "uid": 65534}


def test_shell_script_gets_args_and_declared_env(bwrap):
    request = SandboxRequest(
        argv=["/bin/sh", "script.sh", "two words", "x"],
        files={"script.sh": 'echo "$1|$2|$API_TOKEN"\nexit 3\n'},
        env={"API_TOKEN": "declared-credential"},
    )

    result = run_sandboxed(request, bwrap)

    assert result.stdout == b"two words|x|declared-credential\n"
    assert result.exit_code == 3
    assert result.error_code == "INVALID_ARGUMENT"  # nonzero exit: the user's code failed


def test_files_are_written_into_workspace_and_removed_afterwards(bwrap, monkeypatch):
    host_tmp = tempfile.mkdtemp(prefix="sandbox-test-")
    os.chmod(host_tmp, 0o711)  # the unprivileged bwrap must traverse it
    monkeypatch.setattr(tempfile, "tempdir", host_tmp)
    files = {"data/input.txt": "héllo", "blob.bin": b"\x00\x01"}
    code = """
        print(json.dumps({
            "text": open("data/input.txt", encoding="utf-8").read(),
            "blob": list(open("blob.bin", "rb").read()),
            "listing": sorted(os.listdir(".")),
        }))
        os.makedirs("locked/inner")
        os.chmod("locked", 0)  # must not stop the cleanup
    """
    try:
        request = SandboxRequest(
            argv=["python3", "-I", "main.py"], files={**files, "main.py": PROBE + textwrap.dedent(code)}
        )
        result = run_sandboxed(request, bwrap)
        leftovers = os.listdir(host_tmp)
    finally:
        os.rmdir(host_tmp)

    assert result.error_code is None, result.stderr
    assert last_json(result) == {"text": "héllo", "blob": [0, 1], "listing": ["blob.bin", "data", "main.py"]}
    assert leftovers == []


@pytest.mark.parametrize("name", ["/etc/passwd", "../escape.py", "a/../../escape.py", "", "."])
def test_request_rejects_file_names_outside_the_workspace(name):
    with pytest.raises(ValueError, match="relative"):
        SandboxRequest(argv=["true"], files={name: "x"})


def test_bwrap_argv_pins_the_isolation_flags(bwrap):
    from capabilities.sandbox import _RunDir

    run_dir = _RunDir(SandboxRequest(argv=["true"]), owner=None)
    try:
        offline = bwrap.argv(SandboxRequest(argv=["true"]), run_dir)
        online = bwrap.argv(SandboxRequest(argv=["true"], network=True), run_dir)
    finally:
        run_dir.remove()

    for flag in ["--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--clearenv"]:
        assert flag in offline
    assert "--share-net" not in offline
    assert "--share-net" in online
    assert offline[offline.index("--cap-drop") + 1] == "ALL"
    assert offline[offline.index("--proc") + 1] == "/proc"
    bound = [
        offline[i + 1] for i, arg in enumerate(offline) if arg in ("--bind", "--ro-bind", "--ro-bind-try")
    ]
    for source in bound:
        assert not source.startswith((str(PROJECT), "/root", "/home", "/var", "/etc/shadow"))


# --- escapes ------------------------------------------------------------------------------


def test_loopback_postgres_is_unreachable_inside(bwrap):
    code = """
        print(json.dumps(attempt(lambda: socket.create_connection(("127.0.0.1", 5432), timeout=3) and "connected")))
    """
    result = run_python(bwrap, code)

    assert last_json(result) == {"ok": False, "errno": errno.ECONNREFUSED, "error": "ConnectionRefusedError"}


def test_public_address_is_unreachable_inside(bwrap):
    code = """
        print(json.dumps({
            "interfaces": [name for _, name in socket.if_nameindex()],
            "tcp": attempt(lambda: socket.create_connection(("93.184.215.14", 80), timeout=3) and "connected"),
            "udp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("1.1.1.1", 53))),
        }))
    """
    result = run_python(bwrap, code)

    report = last_json(result)
    assert report["interfaces"] == ["lo"]
    assert report["tcp"]["errno"] == errno.ENETUNREACH
    assert report["udp"]["errno"] == errno.ENETUNREACH


def test_dns_lookup_fails_inside(bwrap):
    result = run_python(bwrap, 'print(json.dumps(attempt(lambda: socket.getaddrinfo("pypi.org", 443))))')

    report = last_json(result)
    assert report["ok"] is False
    assert report["error"] == "gaierror"


def test_platform_secrets_and_host_directories_are_invisible(bwrap):
    secrets = [
        PROJECT,
        PROJECT / "config" / "settings.py",
        PROJECT / ".env",
        PROJECT / "var" / "autoplane.sqlite3",
        PROJECT / "var" / "signing_key.pem",
        PROJECT / "var" / "django_secret_key",
        Path(sys.prefix),  # the project venv
        Path("/etc/shadow"),
        Path("/etc/gshadow"),
        Path("/root"),
        Path("/home"),
        Path("/var"),
        Path("/run"),
        Path("/sys"),
    ]
    code = f"""
        paths = {[str(p) for p in secrets]!r}
        print(json.dumps({{
            "visible": [p for p in paths if os.path.lexists(p)],
            "root": sorted(os.listdir("/")),
            "etc": sorted(os.listdir("/etc")),
            "shadow": attempt(lambda: open("/etc/shadow").read()),
        }}))
    """
    result = run_python(bwrap, code)

    report = last_json(result)
    assert report["visible"] == []
    assert report["root"] == ["bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr", "workspace"]
    assert {"passwd", "group", "hosts"} <= set(report["etc"])
    assert "shadow" not in report["etc"]
    assert report["shadow"]["errno"] == errno.ENOENT


def test_host_environment_is_not_inherited(bwrap, monkeypatch):
    monkeypatch.setenv("AUTOPLANE_CANARY", "host-secret")

    result = run_python(bwrap, "print(json.dumps(dict(os.environ)))", env={"DECLARED": "yes"})

    inside = last_json(result)
    assert "AUTOPLANE_CANARY" not in inside
    assert "host-secret" not in json.dumps(inside)
    assert set(inside) <= {*BASE_ENV, "DECLARED", "PWD"}
    assert inside["DECLARED"] == "yes"
    assert inside["HOME"] == "/workspace"


def test_proc_is_the_sandbox_own_not_the_host(bwrap):
    code = f"""
        print(json.dumps({{
            "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
            "init": open("/proc/1/cmdline", "rb").read().split(b"\\0")[0].decode(),
            "host_pid_visible": os.path.exists("/proc/{os.getpid()}"),
        }}))
    """
    result = run_python(bwrap, code)

    report = last_json(result)
    assert report["pids"] == [1, 2]  # bwrap's reaper and this python
    assert report["init"].endswith("bwrap")
    assert Path("/proc/1/cmdline").read_bytes().split(b"\0")[0] != report["init"].encode()
    assert report["host_pid_visible"] is False


def test_writes_outside_the_workspace_fail(bwrap):
    code = """
        def write(path):
            return attempt(lambda: open(path, "w").write("x"))
        targets = ["/escape", "/usr/escape", "/etc/escape", "/etc/passwd", "/bin/escape", "/dev/escape",
                   "/proc/sys/kernel/hostname", "/tmp/ok", "/workspace/ok"]
        print(json.dumps({path: write(path) for path in targets}))
    """
    result = run_python(bwrap, code)

    report = last_json(result)
    assert report.pop("/tmp/ok")["ok"] is True
    assert report.pop("/workspace/ok")["ok"] is True
    for path, outcome in report.items():
        assert outcome["ok"] is False, path
        assert outcome["errno"] in (errno.EROFS, errno.EACCES, errno.EPERM), path


# --- exhaustion ---------------------------------------------------------------------------


def test_python_fork_bomb_is_contained(bwrap):
    marker = f"bomb_{uuid.uuid4().hex}.py"
    code = """
        while True:
            os.fork()
    """
    result = run_python(bwrap, code, name=marker, timeout_seconds=10)

    assert result.duration_seconds < 10
    assert (result.error_code, result.violation) == ("SANDBOX_VIOLATION", "processes")
    assert host_pids_matching(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_shell_fork_bomb_is_contained(bwrap):
    marker = f"bomb_{uuid.uuid4().hex}.sh"
    request = SandboxRequest(
        argv=["/bin/bash", marker],
        files={marker: ":(){ :|:& };:\nsleep 2\necho survived\n"},
        timeout_seconds=6,
    )

    result = run_sandboxed(request, bwrap)

    assert result.duration_seconds < 6 + SLACK
    assert b"Resource temporarily unavailable" in result.stderr  # the process limit bit
    assert host_pids_matching(marker) == []
    assert subprocess.run(["true"]).returncode == 0


def test_process_limit_is_per_sandbox_so_concurrent_steps_do_not_share_it(bwrap):
    code = """
        import subprocess
        children = [subprocess.Popen(["sleep", "3"]) for _ in range(40)]
        print(json.dumps({"children": len(children)}))
        for child in children:
            child.kill()
    """
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: run_python(bwrap, code, max_processes=64), range(2)))

    for result in results:
        assert result.error_code is None, result.stderr
        assert last_json(result) == {"children": 40}


def test_allocating_4gb_is_reported_as_memory_limit(bwrap):
    result = run_python(bwrap, "blob = bytearray(4 * 1024**3)", memory_mb=256)

    assert result.oom is True
    assert (result.error_code, result.violation) == ("SANDBOX_VIOLATION", "memory")


def test_infinite_loop_times_out(bwrap):
    result = run_python(bwrap, "while True: pass", timeout_seconds=1.5)

    assert result.timed_out is True
    assert (result.error_code, result.violation) == ("TIMEOUT", "wall_time")
    assert result.exit_code is None
    assert 1.5 <= result.duration_seconds < 1.5 + SLACK


def test_cpu_seconds_limit_stops_a_busy_loop(bwrap):
    result = run_python(bwrap, "while True: pass", timeout_seconds=20, cpu_seconds=1)

    assert (result.error_code, result.violation) == ("TIMEOUT", "cpu_time")
    assert result.timed_out is False
    assert result.duration_seconds < 10  # 1 s of CPU; wall time depends on host load


def test_writing_a_10gb_file_is_stopped_by_the_file_size_limit(bwrap):
    code = """
        with open("huge.bin", "wb") as f:
            for _ in range(10 * 1024):
                f.write(b"\\0" * 1024 * 1024)
    """
    result = run_python(bwrap, code, max_file_bytes=8 * 1024 * 1024, timeout_seconds=20)

    assert (result.error_code, result.violation) == ("SANDBOX_VIOLATION", "file_size")
    assert result.duration_seconds < 5


def test_printing_100mb_is_capped_and_finishes_promptly(bwrap):
    code = """
        chunk = "x" * (1024 * 1024)
        for _ in range(100):
            sys.stdout.write(chunk)
    """
    result = run_python(bwrap, code, timeout_seconds=20)

    assert len(result.stdout) == 1024 * 1024
    assert result.stdout_truncated is True
    assert (result.error_code, result.violation) == ("SANDBOX_VIOLATION", "output")
    assert result.duration_seconds < 5


def test_output_slightly_over_the_cap_is_truncated_but_succeeds(bwrap):
    result = run_python(bwrap, 'sys.stdout.write("y" * 1_500_000)')

    assert result.error_code is None
    assert result.stdout_truncated is True
    assert len(result.stdout) == 1024 * 1024


def test_too_many_open_files_is_reported(bwrap):
    result = run_python(bwrap, 'handles = [open("/dev/null") for _ in range(1000)]', max_open_files=64)

    assert (result.error_code, result.violation) == ("SANDBOX_VIOLATION", "open_files")


@pytest.mark.parametrize(
    ("argv", "script"),
    [
        (["/bin/sh"], "nohup sh -c 'sleep 1000; : {marker}' >/dev/null 2>&1 &\necho started\n"),
        (
            ["python3", "-I"],
            "import os, subprocess\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    subprocess.Popen(['sh', '-c', 'sleep 1000; : {marker}'], start_new_session=True)\n"
            "    os._exit(0)\n"
            "os.wait()\nprint('started')\n",
        ),
    ],
    ids=["shell-background", "python-daemon"],
)
def test_background_process_does_not_outlive_the_step(bwrap, argv, script):
    marker = f"marker_{uuid.uuid4().hex}"
    request = SandboxRequest(argv=[*argv, "step"], files={"step": script.format(marker=marker)})

    result = run_sandboxed(request, bwrap)

    assert result.stdout == b"started\n", result.stderr
    assert host_pids_matching(marker) == []


def test_killing_the_parent_from_inside_is_harmless(bwrap):
    code = """
        os.kill(os.getppid(), 9)  # the sandbox's init: the kernel ignores it
        print(json.dumps({"alive": True, "ppid": os.getppid()}))
    """
    python_result = run_python(bwrap, code)
    shell_result = run_sandboxed(
        SandboxRequest(
            argv=["/bin/sh", "k.sh"], files={"k.sh": "sleep 100 &\nkill -9 -1\nkill -9 1\necho after\n"}
        ),
        bwrap,
    )

    assert last_json(python_result) == {"alive": True, "ppid": 1}
    assert shell_result.stdout == b"after\n"
    assert shell_result.duration_seconds < 5


# --- backends and selection ---------------------------------------------------------------


def test_subprocess_backend_runs_code_with_limits_and_minimal_env(monkeypatch):
    monkeypatch.setenv("AUTOPLANE_CANARY", "host-secret")
    backend = get_backend("subprocess")
    assert isinstance(backend, SubprocessBackend)
    marker = f"marker_{uuid.uuid4().hex}"

    ok = run_python(
        backend,
        f"print(json.dumps(sorted(os.environ)))\nimport subprocess\nsubprocess.Popen(['sh', '-c', 'sleep 1000; : {marker}'])",
    )
    hog = run_python(backend, "blob = bytearray(4 * 1024**3)")
    loop = run_python(backend, "while True: pass", timeout_seconds=1)

    assert ok.error_code is None, ok.stderr
    assert "AUTOPLANE_CANARY" not in last_json(ok)
    assert host_pids_matching(marker) == []  # same process group: killed with the step
    assert hog.violation == "memory"
    assert loop.error_code == "TIMEOUT"
    assert loop.duration_seconds < 1 + SLACK


def test_backend_comes_from_settings_and_subprocess_only_by_name(settings):
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"  # the default
    assert isinstance(backend_from_settings(), BubblewrapBackend)

    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = True  # without it the backend refuses (test_sandbox_worker_secrets)
    assert isinstance(backend_from_settings(), SubprocessBackend)


def test_unknown_backend_name_is_rejected():
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        get_backend("docker")


def test_unavailable_backend_fails_closed_and_never_runs_the_command(tmp_path):
    marker = Path(tempfile.gettempdir()) / f"ran_{uuid.uuid4().hex}"
    backend = BubblewrapBackend(bwrap="/nonexistent/bwrap")

    assert backend.available() is False
    with pytest.raises(SandboxUnavailable):
        run_sandboxed(SandboxRequest(argv=["/usr/bin/touch", str(marker)]), backend)
    with pytest.raises(SandboxUnavailable):
        backend.run(SandboxRequest(argv=["/usr/bin/touch", str(marker)]))
    assert not marker.exists()


def test_sandbox_start_overhead(bwrap, capsys):
    request = SandboxRequest(argv=["python3", "-c", "print(1)"])
    direct, sandboxed = [], []
    for _ in range(30):  # interleaved, so load from other processes hits both alike
        started = time.perf_counter()
        subprocess.run(["/usr/bin/python3", "-c", "print(1)"], capture_output=True, check=True)
        direct.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert run_sandboxed(request, bwrap).stdout == b"1\n"
        sandboxed.append(time.perf_counter() - started)

    direct_p50, sandboxed_p50 = statistics.median(direct), statistics.median(sandboxed)
    with capsys.disabled():
        print(
            f"\nsandbox start overhead over 30 runs: direct p50={direct_p50 * 1000:.1f} ms, "
            f"bubblewrap p50={sandboxed_p50 * 1000:.1f} ms, overhead={(sandboxed_p50 - direct_p50) * 1000:.1f} ms"
        )
    assert sandboxed_p50 < 1.0
