"""``manage.py doctor`` as an operator runs it (a process of its own, configured by environment):
exit 0 on a healthy platform, exit 1 naming the broken part, never printing a secret."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from config.celery import QUEUES
from tests.live import REPO, live_worker_env

pytestmark = pytest.mark.workers

SECRET = "s3cret-Do-Not-Print-9f8e7d"


def doctor(*args: str, **env: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "manage.py", "doctor", *args], cwd=REPO, env=live_worker_env(**env),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def lines(output: str) -> dict[str, str]:
    """``{check: "OK"|"WARN"|"FAIL"}`` from the report."""
    found = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] in ("OK", "WARN", "FAIL"):
            found[parts[1]] = parts[0]
    return found


@pytest.fixture
def platform(worker_factory, beat_process):
    """Every queue consumed and one beat: what `up` runs, minus the web."""
    worker_factory(queues=list(QUEUES))
    beat_process()


def test_a_healthy_platform_exits_0_with_every_part_checked(platform):
    code, output = doctor()

    assert code == 0, output
    status = lines(output)
    for check in ("database", "migrations", "broker", "result_backend", "beat", "signing_key", "credential_keys",
                  *(f"workers.{queue}" for queue in QUEUES)):  # fmt: skip
        assert status.get(check) in ("OK", "WARN"), (check, output)
    assert all(status[f"workers.{queue}"] == "OK" for queue in QUEUES), output
    assert status["database"] == "OK"


def test_json_report_for_machines(platform):
    code, output = doctor("--json")

    report = json.loads(output[output.index("{") :])
    assert code == 0
    assert report["ok"] is True
    assert {c["check"] for c in report["checks"]} >= {"database", "broker", "beat"}


def test_a_wrong_broker_url_fails_as_broker_without_its_password(platform):
    code, output = doctor(CELERY_BROKER_URL=f"redis://:{SECRET}@127.0.0.1:1/0",
                          CELERY_RESULT_BACKEND=f"redis://:{SECRET}@127.0.0.1:1/1")  # fmt: skip

    assert code == 1, output
    assert lines(output)["broker"] == "FAIL"
    assert "redis://127.0.0.1:1/0: unreachable" in output
    assert SECRET not in output


def test_a_queue_without_a_worker_fails_by_name(worker_factory, beat_process):
    worker_factory(queues=[q for q in QUEUES if q != "automations_long"])
    beat_process()

    code, output = doctor()

    assert code == 1, output
    status = lines(output)
    assert status["workers.automations_long"] == "FAIL"
    assert status["workers.automations_fast"] == "OK"
    assert "celery -A config worker -Q automations_long" in output


def test_an_unusable_signing_key_and_credential_key_fail_without_showing_them(platform, tmp_path):
    key_file = tmp_path / "signing_key.pem"
    key_file.write_text(f"-----BEGIN PRIVATE KEY-----\n{SECRET}\n-----END PRIVATE KEY-----\n")
    key_file.chmod(0o600)

    code, output = doctor(AUTOPLANE_SIGNING_KEY_FILE=str(key_file), AUTOPLANE_CREDENTIAL_KEYS=SECRET)

    assert code == 1, output
    status = lines(output)
    assert status["signing_key"] == "FAIL"
    assert status["credential_keys"] == "FAIL"
    assert "credential key #1 is not a valid Fernet key" in output
    assert SECRET not in output


def test_a_key_file_others_can_read_is_a_warning(platform, tmp_path):
    key_file = tmp_path / "signing_key.pem"
    subprocess.run([sys.executable, "manage.py", "keygen", "--path", str(key_file)], cwd=REPO,
                   env=live_worker_env(), capture_output=True, check=True)  # fmt: skip
    key_file.chmod(0o644)

    code, output = doctor("--fast", AUTOPLANE_SIGNING_KEY_FILE=str(key_file))

    assert lines(output)["signing_key"] == "WARN", output
    assert "chmod 600" in output
