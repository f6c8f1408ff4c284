"""Thin Celery tasks: take ids, call a service. Execution starts with a claim, so
redelivery is harmless and late acks are safe."""

from __future__ import annotations

from celery import shared_task

from . import enqueue, events, executor, retention, services
from .authoring.drafts import drafts_purge_expired
from .dispatcher import purge_dispatch_keys


@shared_task(name="autoplane.execute_run", bind=True, acks_late=True, reject_on_worker_lost=True,
             ignore_result=True)  # fmt: skip
def execute_run(self, run_id: str, careful: bool = False) -> str | None:
    # A message the broker gives back (its worker died holding it), or one the relay or the
    # sweep sent again (``careful``: its message may have died with a worker), is run step by step.
    redelivered = bool((self.request.delivery_info or {}).get("redelivered"))
    return executor.execute_run(run_id, careful=careful or redelivered)


@shared_task(name="autoplane.resume_run", ignore_result=True)
def resume_run(run_id: str, reason: str = "approval decided") -> bool:
    return services.run_resume(run_id=run_id, reason=reason)


@shared_task(name="autoplane.deliver_event", acks_late=True, ignore_result=True)
def deliver_event(event_id: str) -> int:
    return events.deliver(event_id)


@shared_task(name="autoplane.relay", ignore_result=True)
def relay() -> int:
    return enqueue.runs_relay() + events.redeliver()


@shared_task(name="autoplane.sweep_runs", ignore_result=True)
def sweep_runs() -> dict[str, int]:
    return services.runs_sweep()


@shared_task(name="autoplane.purge_expired", ignore_result=True)
def purge_expired() -> int:
    return events.purge_expired() + purge_dispatch_keys() + drafts_purge_expired()


# One pass deletes at most 200 batches (100k runs at the default batch size); what is
# left waits for the next hour, so a first pass over years of history stays bounded.
@shared_task(name="autoplane.prune_history", ignore_result=True)
def prune_history() -> int:
    return retention.history_prune(max_batches=200).runs
