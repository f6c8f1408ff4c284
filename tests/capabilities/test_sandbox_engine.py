"""Escape and exhaustion attempts as steps of real runs, the backend choice, and
duration-class routing onto real worker pools (SPEC §7.1, §8).

Every hostile step must end the run with a clear step error (or, where the attempt
is simply harmless, succeed) and leave nothing behind on the host. Runs are driven
in-process by the real executor, except the routing test, which uses live workers.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from audit.models import AuditEvent
from automations import executor
from automations.models import FINAL_RUN_STATUSES, Run, RunStatus, StepRun
from automations.services import automation_create, run_create
from capabilities.sandbox import BubblewrapBackend
from config.celery import QUEUE_FAST, QUEUE_LONG, QUEUE_MEDIUM
from tests.factories import definition
from workspaces.services import workspace_get_or_create

BWRAP_AVAILABLE = BubblewrapBackend().available()
SLACK = 3.0  # seconds beyond a timeout for killing, reaping and the engine's bookkeeping


@pytest.fixture
def sandbox():
    if not BWRAP_AVAILABLE:
        pytest.skip("bubblewrap cannot start a sandbox here (apt-get install bubblewrap; user namespaces)")


def python(source: str, step_id: str = "attempt", **config) -> dict:
    return {"step_id": step_id, "action": "run_python", "config": {"code": source, **config}}


def shell(script: str, step_id: str = "attempt", **config) -> dict:
    return {"step_id": step_id, "action": "run_shell", "config": {"script": script, **config}}


def run_to_rest(workspace, *steps) -> tuple[Run, StepRun]:
    automation = automation_create(workspace=workspace, definition=definition(*steps))
    run = run_create(automation=automation, inputs={}).run
    executor.execute_run(str(run.pk))
    run = Run.objects.get(pk=run.pk)
    return run, StepRun.objects.filter(run=run).order_by("-index").first()


def host_pids_matching(marker: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()


# --- escapes: each attempt raises inside, the step fails with the traceback's tail -----------


def _reads(path: Path | str) -> str:
    return f"print(open({str(path)!r}).read())"


def _database_paths() -> list[str]:
    paths = [str(settings.SQLITE_PATH), str(settings.DATA_DIR)]
    if connection.vendor == "sqlite":
        paths.append(str(connection.settings_dict["NAME"]))  # the live test database
    return paths


ESCAPES = [
    ("loopback postgres", "import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=3)",
     "ConnectionRefusedError"),
    ("public address", "import socket\nsocket.create_connection(('93.184.215.14', 80), timeout=3)",
     "Network is unreachable"),
    ("public address over udp", "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('1.1.1.1', 53))",
     "Network is unreachable"),
    ("dns lookup", "import socket\nsocket.getaddrinfo('pypi.org', 443)", "gaierror"),
    ("platform settings", _reads(settings.BASE_DIR / "config" / "settings.py"), "FileNotFoundError"),
    (".env", _reads(settings.BASE_DIR / ".env"), "FileNotFoundError"),
    ("django secret key", _reads(settings.DATA_DIR / "django_secret_key"), "FileNotFoundError"),
    ("signing key", _reads(settings.AUTOPLANE_SIGNING_KEY_FILE), "FileNotFoundError"),
    ("credential keys", _reads(settings.DATA_DIR / "credential_keys"), "FileNotFoundError"),
    ("/etc/shadow", _reads("/etc/shadow"), "FileNotFoundError"),
    ("the project's virtualenv", _reads(Path(sys.prefix) / "pyvenv.cfg"), "FileNotFoundError"),
    ("write into /usr", "open('/usr/lib/escape', 'w')", "Read-only file system"),
    ("overwrite /etc/passwd", "open('/etc/passwd', 'w')", "Read-only file system"),
    ("write into the project", f"open({str(settings.BASE_DIR / 'escape.txt')!r}, 'w')", "FileNotFoundError"),
]  # fmt: skip


@pytest.mark.parametrize(("source", "stderr"), [c[1:] for c in ESCAPES], ids=[c[0] for c in ESCAPES])
def test_escape_attempt_fails_the_step_with_the_reason_in_its_stderr(workspace, sandbox, source, stderr):
    run, step = run_to_rest(workspace, python(source))

    assert run.status == RunStatus.FAILED
    assert (step.error_code, step.error_message) == ("INVALID_ARGUMENT", "the script exited with status 1")
    assert stderr in step.output["data"]["stderr_tail"]


def test_the_platform_files_it_could_not_see_do_exist_on_the_host():
    # Guards the escape cases above against passing only because a path was wrong.
    assert (settings.BASE_DIR / "config" / "settings.py").is_file()
    assert (settings.DATA_DIR / "django_secret_key").is_file()
    assert Path("/etc/shadow").exists()
    assert (Path(sys.prefix) / "pyvenv.cfg").is_file()


def test_database_files_are_invisible(workspace, sandbox):
    source = f"import json, os\nprint(json.dumps([os.path.lexists(p) for p in {_database_paths()!r}]))"

    run, _ = run_to_rest(workspace, python(source))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == [False] * len(_database_paths())
    assert any(Path(p).exists() for p in _database_paths())


def test_sandbox_has_only_loopback_and_writes_outside_the_workspace_stay_inside(workspace, sandbox):
    name = f"escape_{uuid.uuid4().hex}"
    source = f"""
import json, socket
open("/tmp/{name}", "w").write("x")  # the sandbox's own tmpfs
print(json.dumps({{"interfaces": [n for _, n in socket.if_nameindex()]}}))
"""
    run, _ = run_to_rest(workspace, python(source))

    assert run.output == {"interfaces": ["lo"]}
    assert not (Path(tempfile.gettempdir()) / name).exists()
    assert not Path("/tmp", name).exists()  # noqa: S108


def test_shell_write_outside_the_workspace_is_refused(workspace, sandbox):
    run, step = run_to_rest(workspace, shell("set -e\necho pwned > /etc/passwd\necho never"))

    assert step.error_code == "INVALID_ARGUMENT"
    assert "Read-only file system" in step.output["data"]["stderr_tail"]
    assert "never" not in step.output["data"]["stdout_tail"]
    assert "pwned" not in Path("/etc/passwd").read_text()


# --- exhaustion ------------------------------------------------------------------------------


def test_fork_bomb_is_stopped_by_the_process_limit(workspace, sandbox):
    marker = f"bomb_{uuid.uuid4().hex}.py"
    step = {"step_id": "bomb", "action": "run_python",
            "config": {"script": marker, "files": {marker: "import os\nwhile True:\n    os.fork()\n"},
                       "timeout_seconds": 20}}  # fmt: skip
    started = time.monotonic()

    run, failed = run_to_rest(workspace, step)

    assert (failed.error_code, failed.error_message) == (
        "SANDBOX_VIOLATION", "the script tried to start too many processes (limit 64)")  # fmt: skip
    assert run.error["code"] == "SANDBOX_VIOLATION"
    assert time.monotonic() - started < 20
    assert host_pids_matching(marker) == []
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


def test_shell_fork_bomb_is_contained_and_the_script_carries_on(workspace, sandbox):
    marker = f"bomb_{uuid.uuid4().hex}"  # in every bomb process's command line (inherited argv)
    script = "b() { b | b & }\nb\nsleep 1\necho survived"  # forks fail at the limit; sh reports and goes on
    started = time.monotonic()

    run, _ = run_to_rest(workspace, shell(script, timeout_seconds=10, args=[marker]))

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == "survived"
    assert time.monotonic() - started < 10
    assert host_pids_matching(marker) == []  # the rest of the bomb died with the step
    assert subprocess.run(["true"]).returncode == 0


def test_allocating_4gb_is_reported_as_out_of_memory(workspace, sandbox):
    run, failed = run_to_rest(workspace, python("blob = bytearray(4 * 1024**3)"))

    assert (failed.error_code, failed.error_message) == (
        "SANDBOX_VIOLATION", "the script ran out of memory (limit 256 MB)")  # fmt: skip
    assert failed.output["data"]["violation"] == "memory"
    assert "MemoryError" in failed.output["data"]["stderr_tail"]


def test_infinite_loop_is_stopped_at_its_timeout(workspace, sandbox):
    started = time.monotonic()

    run, failed = run_to_rest(workspace, python("while True:\n    pass", timeout_seconds=2))

    elapsed = time.monotonic() - started
    assert (failed.error_code, failed.error_message) == (
        "TIMEOUT", "the script ran longer than its 2 s timeout and was stopped")  # fmt: skip
    assert run.status == RunStatus.FAILED
    assert 2 <= elapsed < 2 + SLACK


def test_writing_a_10gb_file_is_stopped_by_the_file_size_limit(workspace, sandbox):
    source = "with open('huge.bin', 'wb') as f:\n    for _ in range(10 * 1024):\n        f.write(bytes(1024 * 1024))"
    started = time.monotonic()

    _, failed = run_to_rest(workspace, python(source, timeout_seconds=60))

    assert (failed.error_code, failed.error_message) == (
        "SANDBOX_VIOLATION", "the script tried to write a file larger than 64 MB")  # fmt: skip
    assert time.monotonic() - started < 20


def test_printing_100mb_is_stopped_and_only_a_tail_is_stored(workspace, sandbox):
    source = "import sys\nchunk = 'x' * (1024 * 1024)\nfor _ in range(100):\n    sys.stdout.write(chunk)"
    started = time.monotonic()

    _, failed = run_to_rest(workspace, python(source, timeout_seconds=60))

    assert (failed.error_code, failed.error_message) == (
        "SANDBOX_VIOLATION", "the script printed more than 2 MB and was stopped")  # fmt: skip
    assert failed.output["data"]["stdout_truncated"] is True
    assert len(json.dumps(failed.output)) < 20_000
    assert time.monotonic() - started < 15


def test_printing_a_bit_over_the_cap_succeeds_with_a_note(workspace, sandbox):
    run, step = run_to_rest(workspace, python("import sys\nsys.stdout.write('y' * 1_500_000)"))

    assert run.status == RunStatus.SUCCEEDED
    assert "stdout truncated at 1 MB" in step.output["summary"]
    assert len(run.output) == 1024 * 1024


@pytest.mark.parametrize(
    "step",
    [
        shell("nohup sh -c 'sleep 1000; : {marker}' >/dev/null 2>&1 &\necho started"),
        python(
            "import os, subprocess\n"
            "if os.fork() == 0:\n"
            "    os.setsid()\n"
            "    subprocess.Popen(['sh', '-c', 'sleep 1000; : {marker}'], start_new_session=True)\n"
            "    os._exit(0)\n"
            "os.wait()\nprint('started')"
        ),
    ],
    ids=["shell-background", "python-daemon"],
)
def test_process_left_running_does_not_outlive_the_step(workspace, sandbox, step):
    marker = f"marker_{uuid.uuid4().hex}"
    key = "script" if step["action"] == "run_shell" else "code"
    step = {**step, "config": {key: step["config"][key].replace("{marker}", marker)}}

    run, _ = run_to_rest(workspace, step)

    assert run.status == RunStatus.SUCCEEDED, run.error
    assert run.output == "started"
    assert host_pids_matching(marker) == []


def test_killing_its_parent_and_everything_it_can_see_leaves_the_host_alone(workspace, sandbox):
    bystander = subprocess.Popen(["sleep", "60"])  # a host process the step must not reach
    script = "sleep 100 &\nkill -9 $PPID\nkill -9 -1\nkill -9 1\necho after"
    python_kill = "import os\nos.kill(os.getppid(), 9)\nprint(os.getppid())"
    try:
        run, _ = run_to_rest(workspace, shell(script, step_id="sh"), python(python_kill, step_id="py"))

        assert run.status == RunStatus.SUCCEEDED, run.error
        assert StepRun.objects.get(run=run, step_id="sh").output["data"] == "after"
        assert run.output == 1  # the parent it can see is the sandbox's own init, which ignores it
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


# --- backends --------------------------------------------------------------------------------


def _where_am_i() -> dict:
    return python(
        "import json, os, socket\nprint(json.dumps({'host': socket.gethostname(), 'pid': os.getpid()}))"
    )


def test_code_runs_in_bubblewrap_unless_the_subprocess_backend_is_configured(workspace, sandbox, settings):
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"  # the default

    isolated, _ = run_to_rest(workspace, _where_am_i())
    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = True
    unisolated, _ = run_to_rest(workspace, _where_am_i())

    assert isolated.output == {"host": "sandbox", "pid": 2}  # its own uts and pid namespaces
    assert unisolated.output["host"] == socket.gethostname()  # development only: no isolation
    assert unisolated.output["pid"] > 2


def test_unavailable_sandbox_fails_closed_and_the_code_never_runs(workspace, settings):
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"
    settings.AUTOPLANE_BWRAP_PATH = "/nonexistent/bwrap"
    marker = Path(tempfile.gettempdir()) / f"ran_{uuid.uuid4().hex}"

    run, failed = run_to_rest(workspace, python(f"open({str(marker)!r}, 'w').write('ran')"))

    assert run.status == RunStatus.FAILED
    assert (failed.error_code, failed.error_message) == (
        "SANDBOX_VIOLATION", "the sandbox is unavailable; the step was not run")  # fmt: skip
    assert failed.output["error"]["retryable"] is False
    assert not marker.exists()


# --- routing onto real worker pools -----------------------------------------------------------


def _wait_for_rest(run_ids: list, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = {str(r.pk): r for r in Run.objects.filter(pk__in=run_ids)}
        if all(run.status in FINAL_RUN_STATUSES for run in runs.values()):
            return runs
        time.sleep(0.1)
    raise AssertionError(f"runs did not finish: {[(r.pk, r.status) for r in runs.values()]}")


def _executed_by(run: Run) -> int:
    started = AuditEvent.objects.get(trace_id=run.trace_id, type="run.started")
    assert started.summary == f"run started on {run.queue}"
    return int(started.actor.rpartition(":")[2])  # "worker:<host>:<pid>"


@pytest.mark.workers
def test_runs_are_executed_by_the_worker_pool_of_their_duration_class(worker_factory, sandbox):
    pools = {queue: worker_factory(queues=[queue], name=f"{queue}-{uuid.uuid4().hex[:4]}")
             for queue in (QUEUE_FAST, QUEUE_MEDIUM, QUEUE_LONG)}  # fmt: skip
    pool_pids = {queue: set(worker.pool_pids()) for queue, worker in pools.items()}
    workspace = workspace_get_or_create(slug="pools")
    hostile = 'kill -9 $PPID\nkill -9 -1\necho \'{"pool": "fast"}\''  # the worker must shrug this off
    plans = {
        QUEUE_FAST: shell(hostile),
        QUEUE_MEDIUM: {**python('print(\'{"pool": "medium"}\')'), "expected_duration_seconds": 60},
        QUEUE_LONG: python('print(\'{"pool": "long"}\')', timeout_seconds=1800),
    }

    run_ids = {}
    for queue, step in plans.items():
        automation = automation_create(workspace=workspace, definition=definition(step, name=f"on {queue}"))
        run_ids[queue] = run_create(automation=automation, inputs={}).run.pk  # enqueued on commit
    runs = _wait_for_rest(list(run_ids.values()))

    for queue, run_id in run_ids.items():
        run = runs[str(run_id)]
        assert run.status == RunStatus.SUCCEEDED, (queue, run.error, pools[queue].log_tail())
        assert run.queue == queue
        assert run.output == {"pool": queue.removeprefix("automations_")}
        assert _executed_by(run) in pool_pids[queue], (queue, pool_pids)
    assert pools[QUEUE_FAST].alive()
    assert set(pools[QUEUE_FAST].pool_pids()) == pool_pids[QUEUE_FAST]  # no pool process was killed
