"""Thin Celery tasks for notifications: take ids, call a service. On the default queue
(``autoplane.*`` is routed there), which every worker ``up`` and docker-compose start consumes."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(name="autoplane.notify_deliver", bind=True, ignore_result=True)
def notify_deliver(self, delivery_id: str) -> str:
    outcome = services.delivery_attempt(delivery_id)
    if outcome == "retry":
        raise self.retry(countdown=services.retry_countdown(self.request.retries), max_retries=None)
    return outcome


@shared_task(name="autoplane.notify_sweep", ignore_result=True)
def notify_sweep() -> dict[str, int]:
    return services.notifications_sweep()
