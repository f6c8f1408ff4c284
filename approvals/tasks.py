"""Thin Celery tasks for approvals: take ids, call a service."""

from __future__ import annotations

from celery import shared_task

from . import services


@shared_task(name="autoplane.expire_approvals", ignore_result=True)
def expire_approvals() -> dict[str, int]:
    return services.approvals_expire()
