"""docker-compose.yml, Dockerfile and .env.example stay true to the code (without running Docker)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import yaml
from django.core.management import get_commands, load_command_class

from config import celery
from config.celery import QUEUES
from tests.live import REPO

COMPOSE = yaml.safe_load((REPO / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
OUR_ENTRY_POINTS = {"python": [sys.executable], "celery": [sys.executable, "-m", "celery"],
                    "gunicorn": [sys.executable, "-m", "gunicorn"]}  # fmt: skip


def _ours(service: dict) -> bool:
    return isinstance(service.get("command"), list) and service["command"][0] in OUR_ENTRY_POINTS


def _dry_run(command: list[str]) -> list[str]:
    """The same command, made to check itself and exit: every option is parsed, nothing starts.

    Celery (click) rejects unknown options even with --help; gunicorn's
    --check-config also imports the WSGI app.
    """
    argv = OUR_ENTRY_POINTS[command[0]] + command[1:]
    return [*argv, "--check-config"] if command[0] == "gunicorn" else [*argv, "--help"]


def test_every_service_reads_the_env_file():
    for name, service in SERVICES.items():
        assert ".env" in service.get("env_file", []), name


def test_there_is_exactly_one_beat_and_it_is_not_replicated():
    beats = [name for name, s in SERVICES.items() if _ours(s) and s["command"][3:4] == ["beat"]]

    assert beats == ["beat"]
    assert SERVICES["beat"].get("deploy", {}).get("replicas", 1) == 1
    assert "scale" not in SERVICES["beat"]


def test_workers_cover_all_four_queues():
    consumed = set()
    for service in SERVICES.values():
        command = service.get("command") or []
        if command[:4] == ["celery", "-A", "config", "worker"]:
            consumed.update(command[command.index("-Q") + 1].split(","))

    assert consumed == set(QUEUES)
    assert {"worker-fast", "worker-medium", "worker-long"} <= set(SERVICES)


def test_app_services_wait_for_migrate_and_healthy_backends():
    for name in ("web", "beat", "worker-fast", "worker-medium", "worker-long", "worker-default"):
        depends = SERVICES[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == "service_healthy", name
    assert SERVICES["migrate"]["restart"] == "no"
    assert "healthcheck" in SERVICES["postgres"]
    assert "healthcheck" in SERVICES["redis"]


def test_manage_py_commands_exist_and_accept_their_options():
    manage = {
        name: s["command"]
        for name, s in SERVICES.items()
        if s.get("command", [None])[:2] == ["python", "manage.py"]
    }
    assert "migrate" in manage
    for name, command in manage.items():
        app = get_commands()[command[2]]  # KeyError: no such command
        parser = load_command_class(app, command[2]).create_parser("manage.py", command[2])

        parser.parse_args(command[3:])  # CommandError on an unknown or malformed option


def test_celery_and_gunicorn_commands_are_real_entry_points_with_valid_options():
    commands = {name: _dry_run(s["command"]) for name, s in SERVICES.items()
                if _ours(s) and s["command"][0] in ("celery", "gunicorn")}  # fmt: skip
    assert {"web", "beat", "worker-fast", "worker-medium", "worker-long", "worker-default"} <= set(commands)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings"}

    running = {name: subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for name, argv in commands.items()}  # fmt: skip
    failures = {}
    for name, proc in running.items():
        output = proc.communicate(timeout=180)[0].decode(errors="replace")
        if proc.returncode != 0:
            failures[name] = output[-2000:]

    assert failures == {}


def test_web_healthcheck_is_valid_python_against_healthz():
    test = SERVICES["web"]["healthcheck"]["test"]

    assert test[:3] == ["CMD", "python", "-c"]
    compile(test[3], "healthcheck", "exec")
    assert "/healthz" in test[3]


def test_env_example_documents_every_variable_settings_reads():
    settings_source = (REPO / "config" / "settings.py").read_text()
    read = set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', settings_source))
    example = (REPO / ".env.example").read_text()
    documented = set(re.findall(r"^(?:# )?([A-Z][A-Z0-9_]+)=", example, flags=re.MULTILINE))

    assert len(read) > 20
    assert read - documented == set()


@pytest.mark.parametrize("needle", ["bubblewrap", "uv sync --frozen", "python:3.11-slim"])
def test_dockerfile_builds_the_project_as_the_readme_says(needle):
    assert needle in (REPO / "Dockerfile").read_text()


def test_readme_configuration_table_lists_every_variable_settings_reads():
    settings_source = (REPO / "config" / "settings.py").read_text()
    read = set(re.findall(r'env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]+)"', settings_source))
    readme = (REPO / "README.md").read_text()

    assert {name for name in read if f"`{name}`" not in readme} == set()


SOURCE_APPS = [
    "audit",
    "workspaces",
    "capabilities",
    "approvals",
    "notifications",
    "automations",
    "triggers",
    "ops",
]
SOURCE_APPS += ["mcpserver", "config", "bench"]


def test_no_setting_is_read_with_a_hidden_default():
    """Every setting is declared once, in config/settings.py, and read as ``settings.X``: a
    ``getattr(settings, "X", default)`` would hide a second default from .env.example and the README."""
    hidden = [
        f"{path.relative_to(REPO)}:{number}"
        for app in SOURCE_APPS
        for path in (REPO / app).rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"getattr\(\s*(django_)?settings\s*,", line)
    ]

    assert hidden == []


def test_queue_arguments_follow_the_settings_when_celery_is_configured(settings):
    """The queues are declared from the settings when Celery's configuration is first used, not at
    import (the test settings import config/celery.py before they are loaded)."""
    settings.CELERY_BROKER_URL = "amqp://guest@127.0.0.1//"
    settings.CELERY_VISIBILITY_TIMEOUT = 90
    rabbit = celery._queues()["task_queues"]
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:6379/4"
    redis = celery._queues()["task_queues"]

    assert [q.name for q in rabbit] == list(QUEUES)
    assert {q.name: q.queue_arguments for q in rabbit} == {
        name: {"x-consumer-timeout": 90_000} for name in QUEUES
    }
    assert [q.queue_arguments for q in redis] == [None] * len(QUEUES)
    assert [q.name for q in celery.app.conf.task_queues] == list(QUEUES)


def test_workers_get_what_bubblewrap_needs_and_nothing_steers_to_subprocess():
    workers = [name for name, s in SERVICES.items() if (s.get("command") or [])[3:4] == ["worker"]]

    assert workers
    for name in workers:
        options = set(SERVICES[name].get("security_opt", []))
        assert {"seccomp=unconfined", "apparmor=unconfined", "systempaths=unconfined"} <= options, name
        assert "privileged" not in SERVICES[name], name
        assert not SERVICES[name].get("cap_add"), name
    for name in set(SERVICES) - set(workers):
        assert "security_opt" not in SERVICES[name], name  # only the workers run code steps
    compose_text = (REPO / "docker-compose.yml").read_text()
    assert "AUTOPLANE_SANDBOX_BACKEND=subprocess in .env" not in compose_text
    example = (REPO / ".env.example").read_text()
    assert re.search(r"^AUTOPLANE_SANDBOX_BACKEND=bubblewrap$", example, flags=re.MULTILINE)
    assert re.search(r"^AUTOPLANE_SANDBOX_INSECURE=false$", example, flags=re.MULTILINE)
    operations = (REPO / "docs/operations.md").read_text()
    assert "set `AUTOPLANE_SANDBOX_BACKEND=subprocess`" not in operations
    assert "systempaths=unconfined" in operations
    assert "AUTOPLANE_SANDBOX_INSECURE=true" in operations
