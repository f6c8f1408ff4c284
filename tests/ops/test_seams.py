"""The libraries whose internals the fast paths use (config/seams.py): their bounds, doctor's line,
a version outside the bounds, ``AUTOPLANE_FAST_PATHS=off`` taking the public paths, and what
``DATABASE_POOLER=transaction`` turns off."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import tomllib
import uuid

import pytest
from django.core.management import call_command
from django.db import connection
from rest_framework.test import APIClient

from automations import enqueue, executor, services
from automations.models import Run, RunStatus
from config import seams
from config.celery import QUEUES, app
from tests.factories import definition, fire, transform, webhook
from tests.live import REPO, live_worker_env, wait_for_run
from triggers.models import Trigger
from triggers.services import trigger_token_rotate


@pytest.fixture(autouse=True)
def _fresh_checks():
    seams._checked.cache_clear()
    yield
    seams._checked.cache_clear()


def _doctor_seams_line() -> str:
    out = io.StringIO()
    try:
        call_command("doctor", "--fast", stdout=out)
    except SystemExit:  # a failing check elsewhere (e.g. no signing key yet) is not this test's
        pass
    [line] = [line for line in out.getvalue().splitlines() if line.split()[1:2] == ["seams"]]
    return line


def test_the_bounds_are_pyproject_tomls():
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in seams.BOUNDS:
        [spec] = [d for d in dependencies if re.match(rf"{name}(\[[^]]*\])?[<>=]", d)]
        assert sorted(spec.split("]")[-1].removeprefix(name).split(",")) == sorted(
            seams.bounds_text(name).split(",")
        ), spec


def test_doctor_prints_each_seamed_librarys_version_on_one_line(db):
    line = _doctor_seams_line()

    assert line.startswith("OK")
    for name in seams.BOUNDS:
        assert f"{name} {seams.installed(name)}" in line
    assert line.endswith("(fast paths on, prepared statements on)")


def test_the_switches_show_on_doctors_line(db, settings):
    settings.AUTOPLANE_FAST_PATHS = False
    settings.AUTOPLANE_PREPARED_STATEMENTS = False

    assert _doctor_seams_line().endswith("(fast paths off, prepared statements off)")


def test_a_library_outside_its_bounds_takes_the_public_path_with_one_warning(db, monkeypatch, caplog):
    monkeypatch.setitem(seams.BOUNDS, "kombu", ((99, 0), (99, 1)))  # as if kombu were upgraded past them

    with caplog.at_level(logging.WARNING, logger="config.seams"):
        assert [seams.fast_path("kombu") for _ in range(3)] == [False] * 3
        assert enqueue._direct_allowed() is False
    assert seams.fast_path("psycopg") is True

    warnings = [r.getMessage() for r in caplog.records if r.name == "config.seams"]
    assert len(warnings) == 1
    assert "kombu" in warnings[0]
    assert ">=99.0,<99.1" in warnings[0]
    line = _doctor_seams_line()
    assert line.startswith("WARN")
    assert f"kombu {seams.installed('kombu')} (written for >=99.0,<99.1)" in line


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("3.2.0", True),
        ("3.3.9", True),
        ("3.4.0", False),
        ("3.1.19", False),
        ("3.3.10rc1", True),
        ("4.0", False),
    ],
)
def test_within_compares_releases(version, expected):
    assert seams.within("psycopg", version) is expected


@pytest.mark.skipif(connection.vendor != "postgresql", reason="psycopg's fast path: the PostgreSQL lane")
@pytest.mark.django_db(transaction=True)
def test_with_fast_paths_off_the_claim_lets_psycopg_send_its_own_begin(workspace, settings, monkeypatch):
    monkeypatch.setattr("automations.enqueue.publish_run", lambda *args, **kwargs: None)
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("t", {"a": 1}))
    )
    sent: list[str] = []

    def record(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    settings.AUTOPLANE_FAST_PATHS = False
    run = services.run_create(automation=automation, inputs={}).run
    with connection.execute_wrapper(record):
        assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED

    assert sent
    assert not any(sql.lstrip().upper().startswith("BEGIN") for sql in sent), sent[:2]
    settings.AUTOPLANE_FAST_PATHS = True
    run = services.run_create(automation=automation, inputs={}).run
    sent.clear()
    with connection.execute_wrapper(record):
        assert executor.execute_run(str(run.pk)) == RunStatus.SUCCEEDED
    assert sent[0].startswith("BEGIN"), sent[0]  # the fold, on: the claim's BEGIN in its own query


@pytest.mark.workers
@pytest.mark.timeout(180)
def test_with_fast_paths_off_a_fire_is_published_through_celerys_public_path(
    worker_factory, workspace, owner, settings, monkeypatch
):
    """Both lanes: the execute message goes by ``app.send_task`` (on Redis, not the direct LPUSH),
    the rate limit is counted by redis-py's public client, and a worker with the switch off runs it."""
    settings.AUTOPLANE_FAST_PATHS = False
    published: list[str] = []
    real_send_task = app.send_task

    def send_task(name, *args, **kwargs):  # the real send_task, seen
        published.append(name)
        return real_send_task(name, *args, **kwargs)

    monkeypatch.setattr(app, "send_task", send_task)
    automation = services.automation_create(
        workspace=workspace, user=owner,
        definition=definition(transform("t", {"a": 1}), name="public", triggers=[webhook()]),
    )  # fmt: skip
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation, key="hook"), user=owner)
    worker_factory(queues=list(QUEUES), env=live_worker_env(AUTOPLANE_FAST_PATHS="off"))

    response = fire(APIClient(), automation.pk, {"n": 1}, token=token)

    assert response.status_code == 202, response.content
    run = wait_for_run(response.json()["run_id"], {RunStatus.SUCCEEDED}, timeout=60)
    assert published == [enqueue.EXECUTE_TASK]
    assert Run.objects.filter(automation=automation).count() == 1
    assert run.status == RunStatus.SUCCEEDED


@pytest.mark.skipif(not str(app.conf.broker_url).startswith("redis://"), reason="Redis: the Redis lane")
def test_with_fast_paths_off_the_rate_limit_counts_through_redis_pys_public_client(settings):
    from triggers import rate_limit_redis

    settings.AUTOPLANE_FAST_PATHS = False
    key = f"test-window-{uuid.uuid4().hex}"
    url = settings.AUTOPLANE_RATE_LIMIT_REDIS_URL

    assert [rate_limit_redis.count_start(url, key)() for _ in range(3)] == [1, 2, 3]
    assert rate_limit_redis._clients[url].ttl(key) > 0
    rate_limit_redis._clients[url].delete(key)


def _settings_in_child(**env: str) -> subprocess.CompletedProcess:
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.AUTOPLANE_PREPARED_STATEMENTS, settings.DATABASES['default'].get('DISABLE_SERVER_SIDE_CURSORS'))"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings",
             "DATABASE_URL": "postgres://u@127.0.0.1:1/none", **env},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, "True None"),
        ({"DATABASE_POOLER": "transaction"}, "False True"),
        ({"AUTOPLANE_PREPARED_STATEMENTS": "off"}, "False None"),
        ({"DATABASE_POOLER": "session"}, "True None"),
    ],
)
def test_a_transaction_pooler_turns_prepared_statements_and_server_side_cursors_off(env, expected):
    done = _settings_in_child(**env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"DATABASE_POOLER": "transaction", "AUTOPLANE_PREPARED_STATEMENTS": "on"},
            "AUTOPLANE_PREPARED_STATEMENTS",
        ),
        ({"DATABASE_POOLER": "pgbouncer"}, "DATABASE_POOLER must be"),
    ],
)
def test_settings_refuse_prepared_statements_behind_a_transaction_pooler_or_an_unknown_pooler(env, message):
    done = _settings_in_child(**env)
    assert done.returncode != 0
    assert f"ImproperlyConfigured: {message}" in done.stderr
