"""Thin Celery tasks: take ids, call a service."""

from __future__ import annotations

from datetime import UTC, datetime

from celery import shared_task

from . import rejections, schedules


@shared_task(name="autoplane.fire_schedule", acks_late=True, ignore_result=True)
def fire_schedule(trigger_id: str, now: str | None = None) -> str:
    """Sent by beat for each schedule trigger. Late acks are safe: a redelivered tick finds its
    slot already accounted for (trigger row lock + ``last_scheduled_for`` + the slot's dedupe key).

    ``now`` (ISO 8601) stands in for the clock; beat never passes it, tests and operators may.
    """
    moment = datetime.fromisoformat(now) if now else None
    if moment is not None and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return schedules.schedule_fire(trigger_id=trigger_id, now=moment).status


@shared_task(name="autoplane.webhook_rejections_summarize", ignore_result=True)
def webhook_rejections_summarize() -> int:
    return rejections.windows_summarize()
