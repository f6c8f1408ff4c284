"""What a code step can see of the worker that runs it: nothing of its environment, data
directory or keys (issue 32), on the bubblewrap backend; and the subprocess backend, which
cannot hide them, refuses to start unless the deployment says it accepts that."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from automations.models import RunStatus
from capabilities.sandbox import BubblewrapBackend
from tests.capabilities.test_sandbox_engine import python, run_to_rest
from tests.live import REPO

CANARY = "canary-worker-secret-7f3a9c"

_SNOOP = """
import json, os
seen = {"env": dict(os.environ), "cwd": os.getcwd(), "read": {}, "listed": {}}
for path in PATHS:
    try:
        with open(path, "rb") as handle:
            seen["read"][path] = handle.read(200).decode("latin-1")
    except Exception as exc:
        seen["read"][path] = type(exc).__name__
for path in DIRS:
    try:
        seen["listed"][path] = sorted(os.listdir(path))
    except Exception as exc:
        seen["listed"][path] = type(exc).__name__
try:
    seen["proc1"] = open("/proc/1/environ", "rb").read().decode("latin-1")
except Exception as exc:
    seen["proc1"] = type(exc).__name__
print(json.dumps(seen))
"""


@pytest.fixture
def sandbox():
    if not BubblewrapBackend().available():
        pytest.skip("bubblewrap cannot start a sandbox here (apt-get install bubblewrap; user namespaces)")


def _snoop(paths: list[str], dirs: list[str]) -> dict:
    return python(f"PATHS = {paths!r}\nDIRS = {dirs!r}\n" + _SNOOP, step_id="snoop")


@pytest.fixture
def worker_secrets(monkeypatch) -> dict:
    """The worker's environment holds a secret, and its data dir a signing key file."""
    monkeypatch.setenv("AUTOPLANE_CANARY", CANARY)
    monkeypatch.setenv("DATABASE_URL_CANARY", f"postgres://u:{CANARY}@db/x")
    data_dir = Path(django_settings.DATA_DIR)
    key = Path(django_settings.AUTOPLANE_SIGNING_KEY_FILE)
    assert data_dir.is_dir()
    return {"data_dir": str(data_dir), "key": str(key), "repo": str(REPO)}


def test_a_bubblewrap_step_sees_no_worker_environment_data_dir_or_keys(workspace, sandbox, settings,
                                                                        worker_secrets):  # fmt: skip
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"
    key_probe = Path(worker_secrets["data_dir"]) / "probe-secret.txt"
    key_probe.write_text(CANARY)
    try:
        run, step = run_to_rest(workspace, _snoop(
            [worker_secrets["key"], str(key_probe), "/proc/self/environ", f"{worker_secrets['repo']}/pyproject.toml"],
            [worker_secrets["data_dir"], worker_secrets["repo"]],
        ))  # fmt: skip
    finally:
        key_probe.unlink()

    assert run.status == RunStatus.SUCCEEDED, step.error_message
    seen = run.output
    assert CANARY not in json.dumps(seen)
    assert set(seen["env"]) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PWD"}
    assert seen["cwd"] == "/workspace"  # a fresh directory of its own
    for path in (worker_secrets["key"], str(key_probe), f"{worker_secrets['repo']}/pyproject.toml"):
        assert seen["read"][path] in ("FileNotFoundError", "PermissionError"), path
    for path in (worker_secrets["data_dir"], worker_secrets["repo"]):
        assert seen["listed"][path] in ("FileNotFoundError", "PermissionError"), path


def test_a_data_dir_under_a_system_tree_is_hidden_from_the_step(workspace, sandbox, settings):
    """/usr is bound read-only into the sandbox: a data directory placed under it is covered."""
    hidden = Path("/usr/share/doc")
    if not hidden.is_dir() or not os.listdir(hidden):
        pytest.skip("needs a non-empty /usr/share/doc")
    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"
    settings.DATA_DIR = hidden

    run, step = run_to_rest(workspace, _snoop([], [str(hidden), "/usr/bin"]))

    assert run.status == RunStatus.SUCCEEDED, step.error_message
    assert run.output["listed"][str(hidden)] == []
    assert "python3" in run.output["listed"]["/usr/bin"]  # the rest of /usr is still there


def test_the_subprocess_backend_refuses_to_run_a_step_without_the_insecure_flag(
    workspace, settings, tmp_path
):
    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = False
    marker = tmp_path / "ran"

    run, failed = run_to_rest(workspace, python(f"open({str(marker)!r}, 'w').write('ran')"))

    assert run.status == RunStatus.FAILED
    assert failed.error_code == "SANDBOX_VIOLATION"
    assert not marker.exists()


def test_with_the_insecure_flag_subprocess_still_passes_no_worker_environment(workspace, settings,
                                                                              worker_secrets):  # fmt: skip
    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = True

    run, step = run_to_rest(workspace, _snoop([], []))

    assert run.status == RunStatus.SUCCEEDED, step.error_message
    assert CANARY not in json.dumps(run.output["env"])
    assert set(run.output["env"]) <= {"PATH", "HOME", "LANG", "TMPDIR", "PYTHONDONTWRITEBYTECODE", "PWD"}
    assert run.output["cwd"] != os.getcwd()
    assert "autoplane-sandbox-" in run.output["cwd"]


@pytest.mark.parametrize(("insecure", "starts"), [(None, False), ("false", False), ("true", True)])
def test_a_process_configured_for_subprocess_refuses_to_start_without_the_flag(insecure, starts):
    env = {k: v for k, v in os.environ.items() if k != "AUTOPLANE_SANDBOX_INSECURE"}
    env |= {"AUTOPLANE_SANDBOX_BACKEND": "subprocess", "DJANGO_SETTINGS_MODULE": "tests.settings"}
    if insecure is not None:
        env["AUTOPLANE_SANDBOX_INSECURE"] = insecure

    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip

    assert (done.returncode == 0) is starts, done.stderr[-2000:]
    if not starts:
        assert "AUTOPLANE_SANDBOX_INSECURE=true" in done.stderr
        assert done.stderr.strip().count("\n") == 0  # one line, no traceback


@pytest.mark.django_db  # doctor also reads the workspaces (four-eyes advice)
def test_check_deploy_and_doctor_flag_the_insecure_sandbox(settings):
    from django.core import checks

    from ops import doctor

    settings.AUTOPLANE_SANDBOX_BACKEND = "bubblewrap"
    assert "capabilities.W001" not in {m.id for m in checks.run_checks(include_deployment_checks=True)}

    settings.AUTOPLANE_SANDBOX_BACKEND = "subprocess"
    settings.AUTOPLANE_SANDBOX_INSECURE = True
    flagged = [m for m in checks.run_checks(include_deployment_checks=True) if m.id == "capabilities.W001"]
    (finding,) = list(doctor.check_sandbox())

    assert len(flagged) == 1
    assert "AUTOPLANE_SANDBOX_INSECURE=true" in flagged[0].msg
    assert "capabilities.W001" not in {m.id for m in checks.run_checks()}  # a deployment check
    assert finding.status in (doctor.WARN, doctor.FAIL)
    assert "AUTOPLANE_SANDBOX_INSECURE=true" in finding.message
    assert "without isolation" in finding.message
