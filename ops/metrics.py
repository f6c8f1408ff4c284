"""``/metrics`` in the Prometheus text format, computed from the database at scrape time.

Nothing is counted in process memory: gunicorn's workers, the Celery workers
and beat are separate processes, and the database already holds every run,
step, approval and audit event. Each scrape runs a handful of aggregate
queries; a section that fails (say a model another app has not migrated yet)
is skipped and flagged in ``autoplane_scrape_errors`` instead of failing the
scrape.

``autoplane_run_queue_wait_seconds`` and ``autoplane_step_duration_seconds``
are histograms over a sliding window (runs started / steps finished in the last
``WINDOW``), not cumulative counters: read them with ``histogram_quantile()``
directly, without ``rate()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta

from django.apps import apps
from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from audit.sequencer import backlog as audit_backlog
from config.celery import QUEUES
from ops.health import broker_backlog

from .models import HeartbeatKind
from .selectors import heartbeats_fresh, last_seen, workers_by_queue
from .supervisor import read_state

logger = logging.getLogger(__name__)

WINDOW = timedelta(minutes=5)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)


def _model(app_label: str, name: str):
    """Other apps' models by name, so /metrics works whatever subset of them exists."""
    try:
        return apps.get_model(app_label, name)
    except LookupError:
        return None


def _has_field(model, name: str) -> bool:
    return any(field.name == name for field in model._meta.get_fields())


def _histogram(name: str, doc: str, label: str, queryset, *, group_by: str, start: str, end: str) -> Metric:
    """Buckets of ``end - start`` per ``group_by`` value, counted by the database."""
    duration = ExpressionWrapper(F(end) - F(start), output_field=DurationField())
    buckets = {
        f"le_{i}": Count("pk", filter=Q(duration__lte=timedelta(seconds=b))) for i, b in enumerate(BUCKETS)
    }
    rows = (
        queryset.alias(duration=duration)
        .values(group_by)
        .annotate(total=Count("pk"), seconds=Sum("duration"), **buckets)
        .order_by(group_by)
    )
    family = HistogramMetricFamily(name, doc, labels=[label])
    for row in rows:
        cumulative = [(str(b), row[f"le_{i}"]) for i, b in enumerate(BUCKETS)] + [("+Inf", row["total"])]
        seconds = row["seconds"].total_seconds() if row["seconds"] is not None else 0.0
        family.add_metric([row[group_by] or ""], cumulative, sum_value=seconds)
    return family


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
    run = _model("automations", "Run")
    if run is None:
        return
    counts = {status: 0 for status, _ in run._meta.get_field("status").choices}
    counts.update(run.objects.order_by().values_list("status").annotate(n=Count("pk")))
    family = GaugeMetricFamily("autoplane_runs", "Runs by status.", labels=["status"])
    for status, count in sorted(counts.items()):
        family.add_metric([status], count)
    yield family

    # Queue wait: from the moment the dispatcher queued the run to a worker starting it.
    start = "enqueued_at" if _has_field(run, "enqueued_at") else "created_at"
    recent = run.objects.filter(started_at__gte=timezone.now() - WINDOW, **{f"{start}__isnull": False})
    yield _histogram(
        "autoplane_run_queue_wait_seconds",
        f"Queue wait of runs started in the last {WINDOW.seconds // 60} min (sliding window).",
        "queue", recent, group_by="queue", start=start, end="started_at",
    )  # fmt: skip


def steps() -> Iterator[Metric]:
    step_run = _model("automations", "StepRun")
    if step_run is None:
        return
    recent = step_run.objects.filter(finished_at__gte=timezone.now() - WINDOW, started_at__isnull=False)
    yield _histogram(
        "autoplane_step_duration_seconds",
        f"Duration of steps finished in the last {WINDOW.seconds // 60} min (sliding window), by action.",
        "action", recent, group_by="action", start="started_at", end="finished_at",
    )  # fmt: skip


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
    "steps": steps,
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


registry = CollectorRegistry(auto_describe=False)
registry.register(PlatformCollector())


def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
