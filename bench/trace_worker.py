"""Imported by each Celery worker of ``bench --http --trace`` (``--include``): stamps from Celery's signals."""

from __future__ import annotations

from celery import signals

from automations.enqueue import EXECUTE_TASK

from . import trace


def _run_id(args) -> str | None:
    return str(args[0]) if args else None


@signals.task_received.connect(weak=False)
def _received(sender=None, request=None, **kwargs):
    if request is not None and request.name == EXECUTE_TASK and (run_id := _run_id(request.args)):
        trace.stamp(run_id, "worker.received")


@signals.task_prerun.connect(weak=False)
def _prerun(sender=None, args=None, **kwargs):
    if sender is not None and sender.name == EXECUTE_TASK and (run_id := _run_id(args)):
        trace.stamp(run_id, "worker.prerun")


@signals.task_postrun.connect(weak=False)
def _postrun(sender=None, args=None, **kwargs):
    if sender is not None and sender.name == EXECUTE_TASK and (run_id := _run_id(args)):
        trace.stamp(run_id, "worker.postrun")
