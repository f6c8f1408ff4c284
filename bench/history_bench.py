"""History at scale (issue 19): seed a year's worth of runs, then time every list over it.

:func:`seed` writes runs of two steps each, with the 8 audit events such a run writes, into
workspaces of its own (``hist-0`` … ``hist-9``, 20 automations each), through the
ledger's own hashing (:func:`audit.writer.event_hash`), so ``audit_verify`` passes over
them. On PostgreSQL rows go in with ``COPY``; on SQLite with ``bulk_create``. Seeding
again continues the same chains, with newer runs.

:func:`measure` times, in-process (Django's test client, so no web server's share), the
API lists with each filter at the first page and deep (a cursor halfway down), the admin
changelists, a ``/metrics`` scrape and a full ``verify_chain`` of one workspace's chain.
Figures are p50 of ``repeat`` requests, in ms.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from audit.models import AuditChainHead, AuditEvent, HexHashField
from audit.verify import verify_chain
from audit.writer import chain_for, event_hash
from automations.models import Automation, Run, StepRun
from config.pagination import cursor_token
from workspaces.models import Role, Workspace
from workspaces.services import membership_set_role, workspace_get_or_create

WORKSPACES = 10
AUTOMATIONS_PER_WORKSPACE = 20
SEED_USER = "history-bench"
TEST_DATABASE_MARKERS = ("test", "bench", "history", "scratch")

DEFINITION = {
    "schema_version": "1.0",
    "name": "nightly sync",
    "plan": [
        {"step_id": "fetch", "action": "transform_data", "config": {"output": {"orders": "{{ inputs.n }}"}},
         "output_as": "fetched"},
        {"step_id": "report", "action": "transform_data", "config": {"output": {"total": "{{ fetched.orders }}"}}},
    ],
}  # fmt: skip


class NotATestDatabase(Exception):
    pass


def check_database(confirmed: bool) -> str:
    name = str(connection.settings_dict["NAME"])
    if not confirmed and not any(marker in name.lower() for marker in TEST_DATABASE_MARKERS):
        raise NotATestDatabase(
            f"database {name!r} does not look like a test database: pass --yes-this-is-a-test-database"
        )
    return name


def _world() -> tuple[list[Workspace], list[Automation], Any]:
    user, _ = get_user_model().objects.get_or_create(username=SEED_USER, defaults={"is_staff": True,
                                                                                  "is_superuser": True})  # fmt: skip
    workspaces, automations = [], []
    for w in range(WORKSPACES):
        workspace = workspace_get_or_create(slug=f"hist-{w}")
        membership_set_role(workspace=workspace, user=user, role=Role.ADMIN)
        workspaces.append(workspace)
        have = list(Automation.objects.filter(workspace=workspace).order_by("name"))
        for a in range(len(have), AUTOMATIONS_PER_WORKSPACE):
            have.append(Automation.objects.create(workspace=workspace, name=f"sync {w}-{a:02d}",
                                                  definition=DEFINITION, created_by=user))  # fmt: skip
        automations += have
    return workspaces, automations, user


def _layout(model, values: dict) -> tuple[list[str], list[tuple[str, Any, bool]]]:
    """COPY's columns for ``model``, and per column (attname, default, is JSON): every concrete
    field but an auto primary key, the default standing in for what a row does not give."""
    columns, layout = [], []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.attname not in values:
            continue
        columns.append(f'"{field.column}"')
        layout.append((field.attname, field.get_default(), field))
    return columns, layout


def _row(layout, values: dict) -> list:
    row = []
    for attname, default, field in layout:
        value = values.get(attname, default)
        if value is not None and isinstance(field, models.JSONField):
            value = json.dumps(value)
        elif isinstance(field, HexHashField):  # hex in Python, bytes in the table
            value = field.get_db_prep_value(value, connection)
        row.append(value)
    return row


class _Writer:
    """Rows of one model, written with COPY (PostgreSQL) or bulk_create (SQLite)."""

    def __init__(self, model):
        self.model, self.rows, self.columns, self.layout = model, [], None, None

    def add(self, values: dict) -> None:
        if connection.vendor == "postgresql":
            if self.layout is None:
                self.columns, self.layout = _layout(self.model, values)
            self.rows.append(_row(self.layout, values))
        else:
            self.rows.append(self.model(**values))

    def flush(self) -> None:
        if not self.rows:
            return
        if connection.vendor == "postgresql":
            table = self.model._meta.db_table
            with connection.cursor() as cursor:
                raw = cursor.cursor
                with raw.copy(f'COPY "{table}" ({", ".join(self.columns)}) FROM STDIN') as copy:
                    for row in self.rows:
                        copy.write_row(row)
        else:
            self.model.objects.bulk_create(self.rows, batch_size=500)
        self.rows = []


_RUN_EVENTS = (
    ("run.created", "run created", "info"),
    ("run.started", "run started on automations_default", "info"),
    ("step.started", "fetch started (attempt 1)", "info"),
    ("step.succeeded", "fetch succeeded", "success"),
    ("step.started", "report started (attempt 1)", "info"),
    ("step.succeeded", "report succeeded", "success"),
    ("run.succeeded", "run succeeded", "success"),
    ("event.published", "automation.run.succeeded published", "info"),
)


def seed(runs: int, *, days: int = 30, chunk: int = 5000, out=print) -> dict[str, float]:
    """Add ``runs`` runs (2 steps, 8 audit events each) spread over the last ``days`` days."""
    workspaces, automations, _ = _world()
    heads = {}
    for workspace in workspaces:
        chain = chain_for(workspace.pk)
        head, _ = AuditChainHead.objects.get_or_create(chain=chain)
        heads[chain] = [head.seq, head.head_hash, head.last_timestamp]
    start = max([h[2] for h in heads.values() if h[2]] + [timezone.now() - timedelta(days=days)])
    span = (timezone.now() - start).total_seconds()
    step = timedelta(seconds=span / max(runs, 1))
    began = time.perf_counter()
    run_writer, step_writer, audit_writer = _Writer(Run), _Writer(StepRun), _Writer(AuditEvent)
    for i in range(runs):
        automation = automations[i % len(automations)]
        created = start + step * (i + 1)
        status = "failed" if i % 50 == 7 else "cancelled" if i % 97 == 3 else "succeeded"
        run_id, trace = uuid.uuid4(), uuid.uuid4().hex
        run_writer.add({
            "id": run_id, "workspace_id": automation.workspace_id, "automation_id": automation.pk,
            "automation_version": 1, "snapshot": DEFINITION, "status": status, "inputs": {"n": i},
            "trace_id": trace, "queue": "automations_default", "enqueued_at": created,
            "context": {"fetched": {"orders": i}}, "output": {"total": i} if status == "succeeded" else None,
            "error": {"code": "HTTP_ERROR", "message": "upstream 502"} if status == "failed" else None,
            "cost_usd": Decimal("0"), "step_index": 2, "created_at": created,
            "started_at": created + timedelta(milliseconds=20), "finished_at": created + timedelta(milliseconds=80),
        })  # fmt: skip
        for index, step_id in enumerate(("fetch", "report")):
            step_writer.add({
                "run_id": run_id, "index": index, "step_id": step_id, "action": "transform_data",
                "status": "succeeded", "attempt": 1, "rendered_config": DEFINITION["plan"][index]["config"],
                "output": {"data": {"orders": i}, "summary": f"{step_id} ok"}, "cost_usd": Decimal("0"),
                "started_at": created + timedelta(milliseconds=30 + 20 * index),
                "finished_at": created + timedelta(milliseconds=40 + 20 * index),
            })  # fmt: skip
        chain = chain_for(automation.workspace_id)
        head = heads[chain]
        for n, (type_, summary, outcome) in enumerate(_RUN_EVENTS):
            refs = {"run": str(run_id), "automation": str(automation.pk)}
            if type_.startswith("step."):
                refs["step"] = "fetch" if n < 4 else "report"
            fields = {
                "chain": chain, "seq": head[0] + 1, "timestamp": created + timedelta(milliseconds=10 * n),
                "trace_id": trace, "stage": "", "type": type_, "summary": summary, "outcome": outcome,
                "workspace_id": automation.workspace_id, "refs": refs, "actor": "system",
                "payload": {"queue_wait_ms": 3} if type_ == "run.started" else {}, "prev_hash": head[1],
            }  # fmt: skip
            fields["hash"] = event_hash(fields)
            audit_writer.add(fields)
            head[0], head[1], head[2] = fields["seq"], fields["hash"], fields["timestamp"]
        if (i + 1) % chunk == 0 or i + 1 == runs:
            with transaction.atomic():
                run_writer.flush()
                step_writer.flush()
                audit_writer.flush()
                for chain_name, (seq, head_hash, last) in heads.items():
                    AuditChainHead.objects.filter(chain=chain_name).update(
                        seq=seq, head_hash=head_hash, last_timestamp=last
                    )
            out(f"  seeded {i + 1}/{runs} runs ({(i + 1) / (time.perf_counter() - began):.0f} runs/s)")
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            for table in ("automations_run", "automations_steprun", "audit_auditevent"):
                cursor.execute(f"ANALYZE {table}")
    elapsed = time.perf_counter() - began
    return {"runs": runs, "seconds": elapsed, "runs_per_s": runs / elapsed}


def _p50(fn, repeat: int) -> float:
    fn()  # warm: connection, caches, plans
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def _get(client, url, params=None, status=200):
    def call():
        response = client.get(url, params or {})
        assert response.status_code == status, (url, params, response.status_code)

    return call


def buffers_touched(call) -> int | None:
    """8 KB pages the request's SELECTs read (EXPLAIN ANALYZE BUFFERS): its cost, without the machine's load."""
    if connection.vendor != "postgresql":
        return None
    with CaptureQueriesContext(connection) as queries:
        call()
    total = 0
    with connection.cursor() as cursor:
        for query in queries.captured_queries:
            sql = query["sql"]
            if not sql.startswith("SELECT") or "django_session" in sql:
                continue
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}")
            plan = cursor.fetchone()[0]
            plan = json.loads(plan) if isinstance(plan, str) else plan
            top = plan[0]["Plan"]
            total += top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    return total


def storage_per_run() -> dict[str, float] | None:
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        sizes = {}
        for table in ("automations_run", "automations_steprun", "audit_auditevent"):
            cursor.execute("SELECT pg_total_relation_size(%s)", [table])
            sizes[table] = cursor.fetchone()[0]
    runs = Run.objects.count()
    return {table: size / runs for table, size in sizes.items()} | {"total": sum(sizes.values()) / runs}


def measure(*, repeat: int = 7, out=print) -> dict[str, float]:
    _, automations, user = _world()
    token, _ = Token.objects.get_or_create(user=user)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    admin = Client()
    admin.force_login(user)
    runs = Run.objects.filter(workspace__slug__startswith="hist-")
    total = runs.count()
    middle = runs.order_by("-created_at", "-id").values_list("created_at", "id")[total // 2]
    run_cursor = cursor_token([str(middle[0]), str(middle[1])])
    some_run = runs.order_by("-created_at").values_list("id", "trace_id").first()
    deep_event = AuditEvent.objects.order_by("id").values_list("id", flat=True)[
        AuditEvent.objects.count() // 2
    ]
    audit_cursor = cursor_token([deep_event])
    automation = str(automations[3].pk)
    runs_cl = reverse("admin:automations_run_changelist")
    audit_cl = reverse("admin:audit_auditevent_changelist")
    cases = {
        "GET /runs": _get(api, "/api/v1/runs"),
        "GET /runs (halfway, by cursor)": _get(api, "/api/v1/runs", {"cursor": run_cursor}),
        "GET /runs?status=failed": _get(api, "/api/v1/runs", {"status": "failed"}),
        "GET /runs?automation=": _get(api, "/api/v1/runs", {"automation": automation}),
        "GET /audit": _get(api, "/api/v1/audit"),
        "GET /audit (halfway, by cursor)": _get(api, "/api/v1/audit", {"cursor": audit_cursor}),
        "GET /audit?run=": _get(api, "/api/v1/audit", {"run": str(some_run[0])}),
        "GET /audit?trace_id=": _get(api, "/api/v1/audit", {"trace_id": some_run[1]}),
        "GET /audit?type=run.failed": _get(api, "/api/v1/audit", {"type": "run.failed"}),
        "GET /runs/{id}": _get(api, f"/api/v1/runs/{some_run[0]}"),
        "admin runs": _get(admin, runs_cl),
        "admin runs ?status=failed": _get(admin, runs_cl, {"status__exact": "failed"}),
        "admin runs, search trace id": _get(admin, runs_cl, {"q": some_run[1]}),
        "admin runs page 20": _get(admin, runs_cl, {"p": "20"}),
        "admin run page": _get(admin, reverse("admin:automations_run_change", args=[some_run[0]])),
        "admin steps": _get(admin, reverse("admin:automations_steprun_changelist")),
        "admin audit": _get(admin, audit_cl),
        "admin audit, search run id": _get(admin, audit_cl, {"q": str(some_run[0])}),
        "admin audit ?type=run.failed": _get(admin, audit_cl, {"type": "run.failed"}),
        "/metrics scrape": _get(Client(), "/metrics"),
    }
    results = {}
    for name, call in cases.items():
        results[name] = _p50(call, repeat)
        blocks = buffers_touched(call)
        if blocks is not None:
            results[f"{name} [buffers]"] = blocks
        out(f"  {name:<34} {results[name]:8.1f} ms  {blocks if blocks is not None else '-':>7} buffers")
    chain = chain_for(automations[0].workspace_id)
    began = time.perf_counter()
    verified = verify_chain(chain)
    seconds = time.perf_counter() - began
    assert verified.ok, verified.broken
    results["audit_verify (events/s)"] = verified.events / seconds
    out(
        f"  audit_verify one chain: {verified.events} events in {seconds:.1f} s = {verified.events / seconds:,.0f}/s"
    )
    results["runs"] = total
    results["audit events"] = AuditEvent.objects.count()
    return results


def seeded_runs() -> int:
    return Run.objects.filter(workspace__slug__startswith="hist-").count()


def table(figures: dict[int, dict[str, float]]) -> str:
    """Markdown: per figure, its p50 (and pages read) at each size, and the growth of the pages read
    (of the figure itself where no pages were counted) from the smallest size to the largest."""
    sizes = sorted(figures)
    lines = ["| figure | " + " | ".join(f"{s:,} runs" for s in sizes) + " | growth |",
             "| --- |" + " --- |" * (len(sizes) + 1)]  # fmt: skip
    for name in figures[sizes[0]]:
        if name.endswith(" [buffers]"):
            continue
        values = [figures[s].get(name, 0) for s in sizes]
        pages = [figures[s].get(f"{name} [buffers]") for s in sizes]
        basis = pages if pages[0] else values
        growth = f"{basis[-1] / basis[0]:.2f}x" if basis[0] and len(sizes) > 1 else ""
        cells = [f"{v:,.1f}" if v < 1000 else f"{v:,.0f}" for v in values]
        cells = [
            f"{c} ms ({p:,.0f} pages)" if p is not None else c for c, p in zip(cells, pages, strict=True)
        ]
        lines.append(f"| {name} | {' | '.join(cells)} | {growth} |")
    return "\n".join(lines)
