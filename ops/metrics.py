"""``/metrics`` in the Prometheus text format: counters where things happen, gauges at scrape time.

Two kinds of series (docs/operations.md, "Metrics"):

- cumulative counters and histograms (``autoplane_runs_finished_total``,
  ``autoplane_run_duration_seconds``, ...) counted in the process where the
  event happened (:mod:`config.instruments`) and, under ``PROMETHEUS_MULTIPROC_DIR``,
  summed over every web and worker process; plus this process's ``process_*``
  and ``python_*`` metrics;
- gauges of the present (live workers, backlog, active runs, pending approvals,
  audit sequencer lag) read at scrape time with queries bounded by what is active,
  never by history: the scrape costs the same at 1 000 runs and at 10 million.

A section that fails (say a model another app has not migrated yet) is skipped
and flagged in ``autoplane_scrape_errors`` instead of failing the scrape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

from django.apps import apps
from django.conf import settings
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    REGISTRY,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from audit.sequencer import backlog as audit_backlog
from config import instruments
from config.api_errors import json_error
from config.celery import QUEUES
from ops.access import may_read_metrics
from ops.health import broker_backlog

from .models import Heartbeat, HeartbeatKind
from .selectors import heartbeats_fresh, last_seen, workers_by_queue
from .supervisor import read_state

logger = logging.getLogger(__name__)

FINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "timed_out"})

# Heartbeat rows older than this are left out of the per-worker age gauge (a worker
# killed without a clean stop leaves its row; the sweep of history is not ours).
HEARTBEAT_AGE_HORIZON = timedelta(hours=1)
HEARTBEAT_AGE_LIMIT = 500


def _model(app_label: str, name: str):
    """Other apps' models by name, so /metrics works whatever subset of them exists."""
    try:
        return apps.get_model(app_label, name)
    except LookupError:
        return None


def _has_field(model, name: str) -> bool:
    return any(field.name == name for field in model._meta.get_fields())


def processes() -> Iterator[Metric]:
    workers = GaugeMetricFamily(
        "autoplane_workers", "Live Celery workers consuming each queue.", labels=["queue"]
    )
    for queue, count in workers_by_queue(QUEUES).items():
        workers.add_metric([queue], count)
    yield workers
    yield GaugeMetricFamily(
        "autoplane_beat_instances", "Live Celery beat processes (should be exactly 1).",
        value=heartbeats_fresh(kind=HeartbeatKind.BEAT).count(),
    )  # fmt: skip
    tick = last_seen(kind=HeartbeatKind.TICK)
    if tick is not None:
        yield GaugeMetricFamily(
            "autoplane_beat_tick_age_seconds", "Seconds since a worker last executed the beat-scheduled heartbeat.",
            value=(timezone.now() - tick.seen_at).total_seconds(),
        )  # fmt: skip
    now = timezone.now()
    age = GaugeMetricFamily(
        "autoplane_worker_heartbeat_age_seconds", "Seconds since each worker and beat process last wrote its "
        "heartbeat (alive: under 30 s; a row is deleted on a clean stop).", labels=["process", "kind"],
    )  # fmt: skip
    recent = (
        Heartbeat.objects.filter(kind__in=[HeartbeatKind.WORKER, HeartbeatKind.BEAT],
                                 seen_at__gte=now - HEARTBEAT_AGE_HORIZON)
        .order_by("-seen_at").values_list("name", "kind", "seen_at")[:HEARTBEAT_AGE_LIMIT]
    )  # fmt: skip
    for name, kind, seen_at in recent:
        age.add_metric([name, kind], max(0.0, (now - seen_at).total_seconds()))
    yield age


def supervised() -> Iterator[Metric]:
    """Restarts of ``manage.py up``'s children (nothing when not under ``up``)."""
    state = read_state(settings.AUTOPLANE_SUPERVISOR_STATE_FILE)
    if state is None:
        return
    restarts = CounterMetricFamily(
        "autoplane_process_restarts",
        "Restarts of each child of manage.py up since it started.",
        labels=["process"],
    )
    up = GaugeMetricFamily(
        "autoplane_process_up", "1 when the child of manage.py up is running.", labels=["process"]
    )
    for name, child in sorted(state.get("children", {}).items()):
        restarts.add_metric([name], child.get("restarts", 0))
        up.add_metric([name], 1 if child.get("state") == "running" else 0)
    yield restarts
    yield up


def broker() -> Iterator[Metric]:
    backlog = GaugeMetricFamily(
        "autoplane_queue_backlog", "Messages waiting in each broker queue.", labels=["queue"]
    )
    for queue, count in broker_backlog().items():
        backlog.add_metric([queue], count)
    yield backlog


def runs() -> Iterator[Metric]:
    """Runs not yet final, by status: an index range on status, however many finished runs there are."""
    run = _model("automations", "Run")
    if run is None:
        return
    active = [status for status, _ in run._meta.get_field("status").choices if status not in FINAL_STATUSES]
    counts = dict.fromkeys(active, 0)
    counts.update(
        run.objects.filter(status__in=active).order_by().values_list("status").annotate(n=Count("pk"))
    )
    family = GaugeMetricFamily(
        "autoplane_runs", "Runs not yet final, by status (finished runs: autoplane_runs_finished_total).",
        labels=["status"],
    )  # fmt: skip
    for status, count in sorted(counts.items()):
        family.add_metric([status], count)
    yield family


def approvals() -> Iterator[Metric]:
    approval = _model("approvals", "Approval")
    if approval is None or not _has_field(approval, "status"):
        return
    yield GaugeMetricFamily(
        "autoplane_approvals_pending", "Approvals waiting for a decision.",
        value=approval.objects.filter(status="pending").count(),
    )  # fmt: skip


def audit() -> Iterator[Metric]:
    head = _model("audit", "AuditChainHead")
    if head is None:
        return
    totals = head.objects.aggregate(events=Sum("seq"), chains=Count("pk"))
    yield GaugeMetricFamily(
        "autoplane_audit_chain_length", "Events in the audit ledger, summed over all chains.",
        value=totals["events"] or 0,
    )  # fmt: skip
    yield GaugeMetricFamily("autoplane_audit_chains", "Audit chains (one per workspace plus platform).",
                            value=totals["chains"])  # fmt: skip
    waiting = audit_backlog()
    yield GaugeMetricFamily("autoplane_audit_unsequenced_entries", "Audit entries waiting for the sequencer.",
                            value=waiting.entries)  # fmt: skip
    yield GaugeMetricFamily(
        "autoplane_audit_merge_delay_seconds", "How long the oldest audit entry waiting for the sequencer has waited.",
        value=waiting.oldest_age_seconds,
    )  # fmt: skip
    yield GaugeMetricFamily(
        "autoplane_audit_max_merge_delay_seconds", "The bound on the merge delay (AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS).",
        value=settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS,
    )  # fmt: skip


SECTIONS: dict[str, Callable[[], Iterable[Metric]]] = {
    "processes": processes,
    "supervised": supervised,
    "broker": broker,
    "runs": runs,
    "approvals": approvals,
    "audit": audit,
}


class PlatformCollector:
    def collect(self) -> Iterator[Metric]:
        errors = GaugeMetricFamily(
            "autoplane_scrape_errors",
            "1 when a section of this scrape failed (see the web log).",
            labels=["section"],
        )
        for section, produce in SECTIONS.items():
            try:
                metrics = list(produce())  # all or nothing per section
            except Exception:
                logger.warning("metrics section %s failed", section, exc_info=True)
                metrics = []
                errors.add_metric([section], 1)
            else:
                errors.add_metric([section], 0)
            yield from metrics
        yield errors


class InProcessCollector:
    """Without multiprocess mode: this process's own counters, and its process and Python metrics."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def build_registry(multiproc_dir: str = instruments.MULTIPROC_DIR) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlatformCollector())
    if multiproc_dir:
        # Every process's counters, summed; process_* and python_* are this web process's.
        MultiProcessCollector(registry, path=multiproc_dir)
        for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
            registry.register(collector)
    else:
        registry.register(InProcessCollector())
    return registry


registry = build_registry()


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not may_read_metrics(request):  # AUTOPLANE_METRICS_TOKEN is set, and this caller has not got it
        return json_error(401, "UNAUTHENTICATED", "metrics need the metrics token or a staff session",
                          headers={"WWW-Authenticate": "Bearer"})  # fmt: skip
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
