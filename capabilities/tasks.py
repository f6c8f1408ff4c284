"""Thin Celery tasks: call a service."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from . import mcp


# No claim is needed: a harvest is a reconciliation, so running it twice changes nothing.
@shared_task(name="autoplane.harvest_mcp_servers", ignore_result=True, soft_time_limit=1800, time_limit=1900)
def harvest_mcp_servers() -> dict[str, Any]:
    return mcp.mcp_harvest_all()
