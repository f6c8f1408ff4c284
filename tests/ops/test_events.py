"""Flower's view of the platform: task events by setting, and switchable at run time on up's workers."""

from __future__ import annotations

import threading
import time

import pytest
from django.conf import settings

from automations import services
from automations.models import Run, RunStatus
from config.celery import app as celery_app
from ops.management.commands.up import worker_flags
from tests.factories import definition, transform
from tests.live import live_worker_env
from workspaces.services import workspace_get_or_create

pytestmark = [
    pytest.mark.workers,
    pytest.mark.skipif(settings.BROKER_IS_EMBEDDED, reason="the embedded broker cannot broadcast events"),
]


class Receiver:
    """A ``celery events`` consumer on a thread, keeping every event it sees."""

    def __init__(self):
        self.events: list[dict] = []
        self.ready = threading.Event()
        self._receiver = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with celery_app.connection_for_read() as connection:
            self._receiver = celery_app.events.Receiver(connection, handlers={"*": self.events.append})
            self._receiver.on_consume_ready = lambda *args, **kwargs: self.ready.set()
            self._receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self) -> Receiver:
        self._thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self._receiver.should_stop = True
        self._thread.join(5)

    def wait_for(self, predicate, timeout: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [e for e in list(self.events) if predicate(e)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError(
            f"no such event in {len(self.events)}: {[e.get('type') for e in self.events][-20:]}"
        )


def _succeeded(run_id) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if Run.objects.filter(pk=run_id, status=RunStatus.SUCCEEDED).exists():
            return
        time.sleep(0.05)
    raise AssertionError("the run did not succeed")


def _run_once():
    workspace = workspace_get_or_create(slug="acme")
    automation = services.automation_create(workspace=workspace, definition=definition(transform("a", 1)))
    return services.run_create(automation=automation, inputs={}).run


def test_with_the_setting_on_a_worker_sends_task_succeeded_for_execute_run(worker_factory):
    worker_factory(queues=["automations_fast"], env=live_worker_env(CELERY_WORKER_SEND_TASK_EVENTS="true"))

    with Receiver() as events:
        run = _run_once()
        _succeeded(run.pk)

        received = events.wait_for(
            lambda e: e.get("type") == "task-received" and e.get("name") == "autoplane.execute_run"
            and str(run.pk) in e.get("args", "")
        )  # fmt: skip
        task_id = received[0]["uuid"]
        events.wait_for(lambda e: e.get("type") == "task-succeeded" and e.get("uuid") == task_id)


def test_with_the_setting_off_a_worker_started_like_up_can_be_switched_on(worker_factory):
    worker = worker_factory(queues=["automations_fast"], flags=worker_flags(embedded=False),
                            env=live_worker_env(CELERY_WORKER_SEND_TASK_EVENTS="false"))  # fmt: skip

    with Receiver() as events:
        first = _run_once()
        _succeeded(first.pk)
        replies = celery_app.control.enable_events(destination=[worker.nodename], reply=True, timeout=10)
        second = _run_once()
        _succeeded(second.pk)

        assert replies == [{worker.nodename: {"ok": "task events enabled"}}]
        sent = events.wait_for(lambda e: e.get("type") == "task-succeeded")
        received = [e for e in events.events if e.get("type") == "task-received"]
        assert [str(second.pk) in e["args"] for e in received] == [True]  # the first run was before
        assert len(sent) == 1
