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

import hashlib
import json
import multiprocessing
import os
import statistics
import time
import traceback
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection, models, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from audit.models import AuditChainHead, AuditEvent, HexHashField
from audit.verify import verify_chain
from audit.writer import HASHED_FIELDS, canonical_json, chain_for, event_hash
from automations.models import Automation, AutomationVersion, Run, StepRun
from bench.audit_append import backend_cpu
from config.pagination import cursor_token
from workspaces.api_tokens import token_create
from workspaces.models import ApiToken, Role, Workspace
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
        for automation in have:  # version 1 stored, as automation_create does: the runs refer to it
            AutomationVersion.objects.get_or_create(automation=automation, version=1,
                                                    defaults={"definition": DEFINITION, "created_by": user})  # fmt: skip
        automations += have
    return workspaces, automations, user


class _Table:
    """One model's rows as text lines for ``COPY ... FROM STDIN`` (PostgreSQL) or an executemany
    (SQLite): every column that is the same on each row rendered once into a template, each
    varying one a ``%s`` the caller fills with text already in the database's format."""

    def __init__(self, model, fixed: dict[str, Any], varying: tuple[str, ...]):
        self.model, self.lines = model, []
        self.columns, parts = [], []
        for field in model._meta.concrete_fields:
            if field.attname in varying:
                parts.append("%s")
            elif field.primary_key and field.attname not in fixed:
                continue  # the table's own sequence numbers it
            else:
                parts.append(_text(field, fixed.get(field.attname, field.get_default())).replace("%", "%%"))
            self.columns.append(field.column)
        order = [f.attname for f in model._meta.concrete_fields if f.attname in varying]
        assert tuple(order) == varying, f"{model.__name__}: give {order} in table order"
        self.template = "\t".join(parts)

    def write(self, connection) -> None:
        if not self.lines:
            return
        table, columns = self.model._meta.db_table, ", ".join(f'"{c}"' for c in self.columns)
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                with cursor.cursor.copy(f'COPY "{table}" ({columns}) FROM STDIN') as copy:
                    copy.write("\n".join(self.lines) + "\n")
            else:
                marks = ", ".join(["%s"] * len(self.columns))
                rows = [[_sqlite_value(v) for v in line.split("\t")] for line in self.lines]
                cursor.executemany(f'INSERT INTO "{table}" ({columns}) VALUES ({marks})', rows)  # noqa: S608
        self.lines.clear()


def _sqlite_value(text: str) -> str | bytes | None:
    """A field of a COPY line as SQLite's executemany takes it."""
    if text == "\\N":
        return None
    if text.startswith("\\\\x"):  # bytea's hex form, escaped for COPY: a hash, stored as its bytes
        return bytes.fromhex(text[3:])
    return text


def _text(field, value) -> str:
    """``value`` as COPY's text format has it (SQLite's executemany takes the same text)."""
    if value is None:
        text = "\\N"
    elif isinstance(field, HexHashField):  # hex in Python, its bytes in the table: bytea's \x form
        text = "\\\\x" + value if value else ""
    elif isinstance(field, models.JSONField):
        text = json.dumps(value, separators=(",", ":"), sort_keys=True).replace("\\", "\\\\")
    elif isinstance(value, bool):
        text = ("t" if value else "f") if connection.vendor == "postgresql" else str(int(value))
    elif isinstance(value, uuid.UUID):
        text = str(value) if connection.vendor == "postgresql" else value.hex
    elif isinstance(value, datetime):
        text = _timestamp_text(value)
    else:
        text = str(value)
    assert not any(c in text for c in "\t\n\r"), (field, text)
    return text


def _timestamp_text(value: datetime) -> str:
    if connection.vendor == "postgresql":
        return value.isoformat()
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")  # Django's SQLite form


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
# Sentinels that stand for the varying parts of an event while its templates are built.
_PREV, _RUN, _SEQ, _TIME, _TRACE, _HASH = (
    "@@prev@@",
    "@@run@@",
    987654321987,
    "@@time@@",
    "@@trace@@",
    "@@hash@@",
)


def _event_templates(automation: Automation) -> list[tuple[str, str]]:
    """Per event of a run of ``automation``: the template of its hashed text (exactly
    :func:`audit.writer.canonical_json` of what :func:`audit.writer.event_hash` hashes, to be
    filled with prev_hash, run id, seq, timestamp, trace id) and of its COPY line (seq,
    timestamp, trace id, run id, prev_hash, hash)."""
    templates = []
    for n, (type_, summary, outcome) in enumerate(_RUN_EVENTS):
        refs = {"run": _RUN, "automation": str(automation.pk)}
        if type_.startswith("step."):
            refs["step"] = "fetch" if n < 4 else "report"
        fields = {
            "chain": chain_for(automation.workspace_id), "seq": _SEQ, "timestamp": _TIME, "trace_id": _TRACE,
            "stage": "", "type": type_, "summary": summary, "outcome": outcome,
            "workspace_id": automation.workspace_id, "refs": refs, "actor": "system",
            "payload": {"queue_wait_ms": 3} if type_ == "run.started" else {}, "prev_hash": _PREV,
        }  # fmt: skip
        material = canonical_json({name: fields[name] for name in HASHED_FIELDS}).replace("%", "%%")
        hashed = _fill(material, [_PREV, _RUN, str(_SEQ), _TIME, _TRACE])
        table = _Table(AuditEvent, fields | {"hash": _HASH, "entry_hash": ""}, ())
        line = _fill(table.template, [str(_SEQ), _TIME, _TRACE, _RUN, _PREV, _HASH])
        templates.append((hashed, line))
    return templates


def _fill(text: str, sentinels: list[str]) -> str:
    """``text`` with each sentinel (each exactly once, in this order) replaced by ``%s``."""
    at = [text.index(s) for s in sentinels]
    assert at == sorted(at), text
    assert all(text.count(s) == 1 for s in sentinels), text
    for sentinel in sentinels:
        text = text.replace(sentinel, "%s")
    return text


def seed(
    runs: int,
    *,
    days: int = 30,
    chunk: int = 10000,
    jobs: int | None = None,
    defer_indexes: bool | None = None,
    out=print,
) -> dict[str, float]:
    """Add ``runs`` runs (2 steps, 8 audit events each) spread over the last ``days`` days.

    Each event is hashed from a template of its canonical text (the same text
    :func:`audit.writer.event_hash` builds, checked on the first run), and rows go in as
    text with one ``COPY`` per table and chunk, in one transaction with the chain heads.
    On PostgreSQL, outside a transaction, ``jobs`` processes (default: one per core, at
    most 2) share the workspaces, each with its own chains and connection.

    On PostgreSQL, when the seed at least doubles the runs (``defer_indexes`` None: decide so;
    a fresh database always), the three tables' secondary indexes (not the primary keys and
    unique constraints) are dropped first and built again once every row is in: a sorted build
    instead of a B-tree insert per row (see :func:`_drop_secondary_indexes`).
    """
    restore_indexes(out)  # those a seed that stopped half-way left dropped
    workspaces, automations, _ = _world()
    heads = {}
    for workspace in workspaces:
        chain = chain_for(workspace.pk)
        head, _ = AuditChainHead.objects.get_or_create(chain=chain)
        heads[chain] = [head.seq, head.head_hash, head.last_timestamp]
    now = timezone.now()
    start = max([h[2] for h in heads.values() if h[2]] + [now - timedelta(days=days)])
    start_us = int(start.timestamp() * 1_000_000)
    spacing_us = max(int((now - start).total_seconds() * 1_000_000 / max(runs, 1)), 100)
    pg = connection.vendor == "postgresql"
    if jobs is None:
        # Inside a transaction (a test's), other processes could not see the workspaces.
        jobs = min(2, os.cpu_count() or 1) if pg and not connection.in_atomic_block else 1
    ws_index = {w.pk: n for n, w in enumerate(workspaces)}
    plan = _Plan(automations, heads, start_us, spacing_us, runs, chunk, pg)
    began = time.perf_counter()
    if defer_indexes is None:
        defer_indexes = pg and runs >= Run.objects.count()
    if pg and defer_indexes:
        dropped = _drop_secondary_indexes()
        out(f"  {len(dropped)} secondary indexes dropped, built again after the rows are in")
    # CPU seconds spent writing the rows: the seeding processes' own, and their PostgreSQL backends'.
    cpu = {"python": 0.0, "postgres": 0.0}
    if jobs == 1:
        python, backend = time.process_time(), _backend_cpu()
        for done in plan.write(lambda a: True):
            out(f"  seeded {done}/{runs} runs ({done / (time.perf_counter() - began):.0f} runs/s)")
        cpu = {"python": time.process_time() - python, "postgres": _backend_cpu() - backend}
    else:
        connection.close()  # each process opens its own
        context = multiprocessing.get_context("fork")
        progress = context.Queue()
        shares = [
            context.Process(
                target=_share, args=(plan, lambda a, k=k: ws_index[a.workspace_id] % jobs == k, progress)
            )
            for k in range(jobs)
        ]
        for process in shares:
            process.start()
        done, running = 0, jobs
        while running:
            kind, value = progress.get()
            if kind == "error":
                for process in shares:
                    process.terminate()
                raise RuntimeError(f"seeding failed in a worker process:\n{value}")
            if kind == "finished":
                running -= 1
                cpu = {key: cpu[key] + value[key] for key in cpu}
                continue
            done += value
            out(f"  seeded {done}/{runs} runs ({done / (time.perf_counter() - began):.0f} runs/s)")
        for process in shares:
            process.join()
    rows_written = time.perf_counter()
    after_rows = _backend_cpu()
    if pg and defer_indexes:
        built = time.perf_counter()
        restore_indexes(out)
        out(f"  indexes built in {time.perf_counter() - built:.1f} s")
    if pg:
        vacuumed = time.perf_counter()
        # Statistics for the planner and, outside a transaction, the visibility map too: seeded
        # history stands for old rows, which autovacuum has long passed over in a live database.
        command = "ANALYZE" if connection.in_atomic_block else "VACUUM (ANALYZE)"
        with connection.cursor() as cursor:
            for table in ("automations_run", "automations_steprun", "audit_auditevent"):
                cursor.execute(f"{command} {table}")
        out(f"  {command} in {time.perf_counter() - vacuumed:.1f} s")
    elapsed = time.perf_counter() - began
    cpu["postgres_after"] = _backend_cpu() - after_rows
    per_run = {key: value * 1e6 / max(runs, 1) for key, value in cpu.items()}
    out(
        f"  rows in {rows_written - began:.1f} s ({runs / (rows_written - began):.0f} runs/s), then"
        f" {elapsed - (rows_written - began):.1f} s of index builds and vacuum. CPU per run: Python"
        f" {per_run['python']:.0f} µs, PostgreSQL {per_run['postgres']:.0f} µs taking the rows and"
        f" {per_run['postgres_after']:.0f} µs building indexes and vacuuming"
        + ("" if pg and _backend_cpu() else " (PostgreSQL's share not readable here)")
    )
    return {"runs": runs, "seconds": elapsed, "runs_per_s": runs / elapsed} | {
        f"cpu_us_per_run_{key}": value for key, value in per_run.items()
    }


def _backend_cpu() -> float:
    """CPU seconds of this connection's PostgreSQL backend so far; 0 when it cannot be read."""
    return backend_cpu(connection) or 0.0


_SEEDED_TABLES = ("automations_run", "automations_steprun", "audit_auditevent")
# The definitions of the indexes a seed dropped, written in the transaction that drops them
# and deleted in the one that builds each again: a seed killed in between leaves them here,
# and the next seed (or ``restore_indexes``) builds them first.
_DROPPED = "seed_history_dropped_index"


def _drop_secondary_indexes() -> list[str]:
    """Drop the seeded tables' indexes that back no constraint (primary keys and unique
    constraints stay, so every row is still checked) and that the seeded rows go into (the runs'
    partial indexes stay), recording each one's definition."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {_DROPPED} (name text PRIMARY KEY, definition text NOT NULL)"
        )
        cursor.execute(
            "SELECT i.indexrelid::regclass::text, pg_get_indexdef(i.indexrelid) FROM pg_index i"
            " JOIN pg_class t ON t.oid = i.indrelid WHERE t.relname = ANY(%s) AND t.relnamespace ="
            " 'public'::regnamespace AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
            # The runs' partial indexes hold active runs and re-runs, which a seed never writes: they
            # stay (and a status IN (...) predicate would not come back as the text it was created with).
            " AND NOT (t.relname = 'automations_run' AND i.indpred IS NOT NULL)"
            " ORDER BY 1",
            [list(_SEEDED_TABLES)],
        )
        indexes = cursor.fetchall()
        for name, definition in indexes:
            cursor.execute(f"INSERT INTO {_DROPPED} (name, definition) VALUES (%s, %s)", [name, definition])
            cursor.execute(f"DROP INDEX {name}")
    return [name for name, _ in indexes]


def restore_indexes(out=print) -> list[str]:
    """Build again every index a seed dropped, each in one transaction with the deletion of its
    record; PostgreSQL only. Returns their names."""
    if connection.vendor != "postgresql":
        return []
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [_DROPPED])
        if cursor.fetchone()[0] is None:
            return []
        cursor.execute(f"SELECT name, definition FROM {_DROPPED} ORDER BY name")
        pending = cursor.fetchall()
    for name, definition in pending:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
            cursor.execute(f"DROP INDEX IF EXISTS {name}")  # an invalid one a killed build left
            cursor.execute(definition)
            cursor.execute(f"DELETE FROM {_DROPPED} WHERE name = %s", [name])
    if pending:
        out(f"  {len(pending)} indexes built: {', '.join(name for name, _ in pending)}")
    return [name for name, _ in pending]


def _share(plan: _Plan, mine, progress) -> None:
    """One process's share of the workspaces (forked: Django is set up, the connection is its own)."""
    try:
        before, python, backend = 0, time.process_time(), _backend_cpu()
        for done in plan.write(mine):
            progress.put(("runs", done - before))
            before = done
        progress.put(
            ("finished", {"python": time.process_time() - python, "postgres": _backend_cpu() - backend})
        )
    except BaseException:  # noqa: BLE001 - reported to the parent, which stops
        progress.put(("error", traceback.format_exc()))
    finally:
        connection.close()


class _Plan:
    """The rows of ``runs`` runs over ``automations``: run ``i`` belongs to automation ``i`` modulo
    their number and was created ``spacing_us`` after run ``i - 1``. :meth:`write` writes those
    whose automation ``mine`` accepts, ``chunk`` at a time, and yields the count written so far."""

    def __init__(self, automations, heads, start_us, spacing_us, runs, chunk, pg):
        self.automations, self.heads, self.pg = automations, heads, pg
        self.start_us, self.spacing_us, self.runs, self.chunk = start_us, spacing_us, runs, chunk

    def write(self, mine):
        pg, heads = self.pg, self.heads
        run_table = _Table(Run, {
            "automation_version": 1, "snapshot_copy": None, "queue": "automations_default",
            "cost_usd": Decimal("0"), "step_index": 2,
        }, ("id", "workspace_id", "automation_id", "status", "inputs", "trace_id", "enqueued_at", "context",
            "output", "error", "created_at", "started_at", "finished_at"))  # fmt: skip
        fetch_table, report_table = [_Table(StepRun, {
            "index": index, "step_id": step_id, "action": "transform_data", "status": "succeeded", "attempt": 1,
            "rendered_config": DEFINITION["plan"][index]["config"], "cost_usd": Decimal("0"),
        }, ("run_id", "output", "started_at", "finished_at")) for index, step_id in enumerate(("fetch", "report"))]  # fmt: skip
        audit_table = _Table(AuditEvent, {}, ())
        uuid_column = Run._meta.get_field("automation")
        per_automation = [
            (a.workspace_id, _text(uuid_column, a.pk), heads[chain_for(a.workspace_id)], _event_templates(a))
            if mine(a)
            else None
            for a in self.automations
        ]
        chains = {chain_for(a.workspace_id) for a in self.automations if mine(a)}
        failed_error = _text(Run._meta.get_field("error"), {"code": "HTTP_ERROR", "message": "upstream 502"})
        clock = _Clock()
        sha256, urandom, count = hashlib.sha256, os.urandom, len(per_automation)
        done = pending = 0
        checked = False
        run_lines, audit_lines = run_table.lines, audit_table.lines
        fetch_lines, report_lines = fetch_table.lines, report_table.lines
        for i in range(self.runs):
            mine_ = per_automation[i % count]
            if mine_ is None:
                continue
            workspace_id, automation_id, head, templates = mine_
            created = self.start_us + self.spacing_us * (i + 1)
            at = clock.times(created, 9, 10_000)  # every 10 ms of the run
            db = at if pg else [t[:26].replace("T", " ") for t in at]
            status = "failed" if i % 50 == 7 else "cancelled" if i % 97 == 3 else "succeeded"
            random = urandom(32).hex()  # a version-4 uuid's text and a trace id, from one read
            run_id = f"{random[:8]}-{random[8:12]}-4{random[13:16]}-a{random[17:20]}-{random[20:32]}"
            trace = random[32:]
            db_run_id = run_id if pg else run_id.replace("-", "")
            run_lines.append(run_table.template % (
                db_run_id, workspace_id, automation_id, status, f'{{"n":{i}}}', trace, db[0],
                f'{{"fetched":{{"orders":{i}}}}}', f'{{"total":{i}}}' if status == "succeeded" else "\\N",
                failed_error if status == "failed" else "\\N", db[0], db[2], db[8],
            ))  # fmt: skip
            fetch_lines.append(
                fetch_table.template
                % (db_run_id, f'{{"data":{{"orders":{i}}},"summary":"fetch ok"}}', db[3], db[4])
            )
            report_lines.append(
                report_table.template
                % (db_run_id, f'{{"data":{{"orders":{i}}},"summary":"report ok"}}', db[5], db[6])
            )
            seq, prev = head[0], head[1]
            for n, (hashed, line) in enumerate(templates):
                seq += 1
                digest = sha256((hashed % (prev, run_id, seq, at[n], trace)).encode()).hexdigest()
                audit_lines.append(line % (seq, db[n], trace, run_id, prev, digest))
                prev = digest
            head[0], head[1] = seq, prev
            head[2] = at[7]
            pending += 1
            if pending == self.chunk:
                if not checked:
                    _check_first_run(audit_lines[:8])
                    checked = True
                self._flush((run_table, fetch_table, report_table, audit_table), chains)
                done += pending
                pending = 0
                yield done
        if pending:
            if not checked:
                _check_first_run(audit_lines[:8])
            self._flush((run_table, fetch_table, report_table, audit_table), chains)
            yield done + pending

    def _flush(self, tables, chains) -> None:
        with transaction.atomic():
            if self.pg:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT current_setting('is_superuser')")
                    if cursor.fetchone()[0] == "on":
                        # No foreign-key triggers: every row refers to this command's own runs,
                        # automations and workspaces, created before. Only for this transaction.
                        cursor.execute("SET LOCAL session_replication_role = replica")
                    # Seeded rows stand for old history: a crash may lose the last chunks (the chain
                    # heads with them), never half of one; the commit need not wait for the disk.
                    cursor.execute("SET LOCAL synchronous_commit = off")
            for table in tables:
                table.write(connection)
            for chain in chains:
                seq, head_hash, last = self.heads[chain]
                last = datetime.fromisoformat(last) if isinstance(last, str) else last
                AuditChainHead.objects.filter(chain=chain).update(
                    seq=seq, head_hash=head_hash, last_timestamp=last
                )


class _Clock:
    """Microseconds since the epoch as the ledger's timestamp text (``isoformat``, UTC), quickly:
    the date and time to the second is formatted once per second."""

    def __init__(self):
        self.second, self.prefix = -1, ""

    def iso(self, us: int) -> str:
        second, fraction = divmod(us, 1_000_000)
        if second != self.second:
            self.second = second
            self.prefix = datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self.prefix}.{fraction:06d}+00:00"

    def times(self, us: int, count: int, step: int) -> list[str]:
        """``iso`` of ``us`` and of the ``count - 1`` instants ``step`` µs apart after it."""
        first = self.iso(us)
        fraction = us % 1_000_000
        if fraction + step * (count - 1) >= 1_000_000:  # crosses a second
            return [first] + [self.iso(us + step * k) for k in range(1, count)]
        prefix = self.prefix
        return [f"{prefix}.{f:06d}+00:00" for f in range(fraction, fraction + step * count, step)]


def _check_first_run(lines: list[str]) -> None:
    """The templated hashes of the first run equal the ledger's own :func:`event_hash`."""
    columns = [f.attname for f in AuditEvent._meta.concrete_fields if f.attname != "id"]
    for line in lines:
        fields = dict(zip(columns, line.split("\t"), strict=True))
        for name in ("prev_hash", "hash"):
            fields[name] = fields[name].removeprefix("\\\\x")
        fields |= {"seq": int(fields["seq"]), "workspace_id": int(fields["workspace_id"]),
                   "refs": json.loads(fields["refs"]), "payload": json.loads(fields["payload"]),
                   "timestamp": datetime.fromisoformat(fields["timestamp"]).replace(tzinfo=UTC)}  # fmt: skip
        assert event_hash(fields) == fields["hash"], f"seeded hash differs from the ledger's: {line}"


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
    earlier = ApiToken.objects.filter(user=user, name="history-bench").exists()  # rotated, not piled up
    _, token = token_create(user=user, name="history-bench", replace="history-bench" if earlier else None)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
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
    results["load average (1 min) after"] = os.getloadavg()[0]
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
