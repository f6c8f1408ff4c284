"""``/healthz``: is every part of the platform there?

Answers ``{"status": "ok"|"degraded", "failing": [...], "checks": {...}}`` with
200 when every check passes and 503 otherwise; ``failing`` names each failed
check (``database``, ``broker``, ``beat``, ``queues.<name>``). Checks:

- database: ``SELECT 1``;
- broker: a fresh connection to the Celery broker, plus each queue's backlog;
- beat: exactly one beat process heartbeating (two would fire every schedule
  twice); ``last_tick_age_seconds`` tells when a worker last executed the
  beat-scheduled ``autoplane.beat_heartbeat``, i.e. beat -> broker -> worker;
- queues: at least one live worker consuming each of the four queues;
- processes (only under ``manage.py up``): each supervised child is running and
  not crash-looping, from the supervisor's state file
  (``AUTOPLANE_SUPERVISOR_STATE_FILE``, set by ``up``); a failing child is named
  ``processes.<child>``, e.g. ``processes.worker-fast``.

- sandbox: the configured backend for code steps (``run_python``/``run_shell``)
  and whether it can start here, e.g. ``{"backend": "bubblewrap", "ok": true}``;
  when it cannot, ``ok`` is false with ``error: "unavailable: code steps fail
  closed"``. It is reported, not counted in ``failing``: every other automation
  still runs, and code steps refuse to run rather than run unisolated. A
  development ``subprocess`` backend is flagged ``isolated: false``.

An anonymous caller gets ``{"status": ...}`` only, with the same status code, unless
``AUTOPLANE_HEALTHZ_DETAILS=public``; a staff session or the metrics token
(``ops.access``) gets the whole report.

Workers and beat are known by their heartbeat rows (see ``ops/heartbeats.py``),
because the embedded broker cannot broadcast ``inspect()`` requests.
Error details go to the log, never into the response.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone

from audit.sequencer import backlog as audit_backlog
from capabilities.sandbox import backend_from_settings
from config.celery import QUEUES, queue_backlog
from config.celery import app as celery_app
from ops.access import may_read_health_details
from ops.models import HeartbeatKind
from ops.selectors import STALE_AFTER, heartbeats_fresh, last_seen, workers_by_queue
from ops.supervisor import child_health, read_state

logger = logging.getLogger(__name__)

BROKER_TIMEOUT_SECONDS = 3.0


def _failure(check: str, exc: BaseException) -> dict[str, Any]:
    logger.warning("health check %s failed: %r", check, exc)
    return {"ok": False, "error": type(exc).__name__}


def check_database() -> dict[str, Any]:
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except Exception as exc:
        return _failure("database", exc)
    return {
        "ok": True,
        "vendor": connection.vendor,
        "latency_ms": round((time.perf_counter() - started) * 1000, 1),
    }


def broker_backlog(queues: tuple[str, ...] = QUEUES) -> dict[str, int]:
    """Messages waiting in each queue, from a fresh broker connection (raises when unreachable)."""
    return queue_backlog(queues, BROKER_TIMEOUT_SECONDS)


def check_broker() -> dict[str, Any]:
    started = time.perf_counter()
    try:
        backlog = broker_backlog()
    except Exception as exc:
        return _failure("broker", exc)
    return {
        "ok": True,
        "transport": celery_app.conf.broker_url.split(":", 1)[0],
        "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        "backlog": backlog,
    }


def _age(heartbeat) -> float | None:
    return None if heartbeat is None else round((timezone.now() - heartbeat.seen_at).total_seconds(), 1)


def check_processes() -> dict[str, Any]:
    """The beat and per-queue worker checks, from the heartbeat table."""
    try:
        beats = heartbeats_fresh(kind=HeartbeatKind.BEAT).count()
        beat: dict[str, Any] = {
            "ok": beats == 1,
            "instances": beats,
            "heartbeat_age_seconds": _age(last_seen(kind=HeartbeatKind.BEAT)),
            "last_tick_age_seconds": _age(last_seen(kind=HeartbeatKind.TICK)),
        }
        if beats == 0:
            beat["error"] = f"no beat heartbeat in the last {STALE_AFTER.total_seconds():.0f} s"
        elif beats > 1:
            beat["error"] = f"{beats} beat processes are running; run exactly one"
        queues = {
            queue: {"ok": workers > 0, "workers": workers}
            for queue, workers in workers_by_queue(QUEUES).items()
        }
    except Exception as exc:
        failure = _failure("heartbeats", exc)
        return {"beat": failure, "queues": {queue: dict(failure) for queue in QUEUES}}
    return {"beat": beat, "queues": queues}


def check_supervised() -> dict[str, Any] | None:
    """Each child of ``manage.py up``: running, restarts, crash-looping; None when not under ``up``."""
    state = read_state(settings.AUTOPLANE_SUPERVISOR_STATE_FILE)
    if state is None:
        return None
    now = time.time()
    return {name: child_health(child, now) for name, child in sorted(state.get("children", {}).items())}


def check_audit_sequencer() -> dict[str, Any]:
    """Appended audit entries are chained within the maximum merge delay (docs/audit.md)."""
    try:
        waiting = audit_backlog()
    except Exception as exc:
        return _failure("audit sequencer", exc)
    check: dict[str, Any] = {
        "ok": waiting.within_bound,
        "waiting_entries": waiting.entries,
        "merge_delay_seconds": waiting.oldest_age_seconds,
        "max_merge_delay_seconds": settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS,
    }
    if not waiting.within_bound:
        check["error"] = "audit entries wait longer than the maximum merge delay: is the sequencer running?"
    return check


# A failed bubblewrap probe is not remembered by the backend (it starts bwrap again each
# time); /healthz, polled every few seconds, asks again only this often.
SANDBOX_RECHECK_SECONDS = 60.0
_sandbox_checked: dict[tuple[str, str], tuple[float, dict[str, Any]]] = {}


def check_sandbox() -> dict[str, Any]:
    """Can code steps run here? (Checked in this process, on this host: the web's host under ``up``.)"""
    key = (settings.AUTOPLANE_SANDBOX_BACKEND, settings.AUTOPLANE_BWRAP_PATH)
    cached = _sandbox_checked.get(key)
    if cached is not None and time.monotonic() - cached[0] < SANDBOX_RECHECK_SECONDS:
        return dict(cached[1])
    try:
        backend = backend_from_settings()
        ok = backend.available()
    except Exception as exc:
        return {**_failure("sandbox", exc), "error": "unavailable: code steps fail closed"}
    check: dict[str, Any] = {"backend": backend.name, "ok": ok, "isolated": backend.name == "bubblewrap"}
    if not ok:
        check["error"] = "unavailable: code steps fail closed"
    _sandbox_checked[key] = (time.monotonic(), check)
    return dict(check)


def health_report() -> dict[str, Any]:
    checks: dict[str, Any] = {
        "database": check_database(), "broker": check_broker(), **check_processes(),
        "audit_sequencer": check_audit_sequencer(), "sandbox": check_sandbox(),
    }  # fmt: skip
    supervised = check_supervised()
    if supervised is not None:
        checks["processes"] = supervised
    failing = [name for name in ("database", "broker", "beat", "audit_sequencer") if not checks[name]["ok"]]
    failing += [f"queues.{queue}" for queue, check in checks["queues"].items() if not check["ok"]]
    failing += [f"processes.{name}" for name, check in (supervised or {}).items() if not check["ok"]]
    return {"status": "degraded" if failing else "ok", "failing": failing, "checks": checks}


def healthz(request: HttpRequest) -> JsonResponse:
    if request.method not in ("GET", "HEAD"):
        body = {"error": {"code": "METHOD_NOT_ALLOWED", "message": "use GET"}}
        return JsonResponse(body, status=405, headers={"Allow": "GET, HEAD"})
    report = health_report()
    body = report if may_read_health_details(request) else {"status": report["status"]}
    response = JsonResponse(body, status=200 if report["status"] == "ok" else 503)
    response["Cache-Control"] = "no-store"
    # A 503 here is an answer, not a server error: keep django.request from
    # logging an ERROR on every poll of a degraded platform.
    response._has_been_logged = True  # type: ignore[attr-defined]  # django.utils.log's private flag: not in the stubs
    return response
