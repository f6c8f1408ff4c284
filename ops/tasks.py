from __future__ import annotations

import os
import socket

from celery import shared_task

from .models import HeartbeatKind
from .services import heartbeat_record, heartbeats_prune

TICK_NAME = "beat-tick"


@shared_task(name="autoplane.beat_heartbeat", ignore_result=True)
def beat_heartbeat() -> None:
    """Scheduled by beat every 10 s; executing it proves beat -> broker -> worker works."""
    heartbeat_record(name=TICK_NAME, kind=HeartbeatKind.TICK, hostname=socket.gethostname(), pid=os.getpid())
    heartbeats_prune()
