"""``manage.py bench --profile``: SQL statements and CPU per webhook fire and per one-step run (issue 11).

In-process and without workers, on the configured database (and broker, which
the fire publishes to): ``n`` webhook fires through Django's full request
stack (middleware, DRF, the fire service), then ``n`` executions of the runs
they created by the real executor (claim, the ``transform_data`` step, finish).
For each it reports the SQL statements (counted by a connection execute
wrapper, so savepoints and BEGIN/COMMIT the ORM issues count too) and the
process CPU time per item; with ``--profile-top`` the cProfile functions with
the most cumulative time. CPU time is this process's only (PostgreSQL's own
work is not in it), which keeps it more comparable on a loaded machine than
wall time; the number of Python function calls (counted by cProfile on the
other half of the items) does not depend on load at all.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from django.db import connection
from django.test import Client

from automations import executor, services
from automations.claim import worker_id
from config.celery import QUEUES, app
from triggers.models import Trigger
from triggers.services import trigger_token_rotate
from workspaces.services import workspace_get_or_create


@dataclass
class Statements:
    """Counts every statement sent on the default connection, by its first words."""

    total: int = 0
    kinds: Counter = field(default_factory=Counter)

    def __call__(self, execute, sql, params, many, context):
        self.total += 1
        words = sql.split(None, 3)
        self.kinds[" ".join(words[:3]) if words and words[0].upper() in ("INSERT", "UPDATE", "DELETE")
                   else (words[0] if words else "")] += 1  # fmt: skip
        return execute(sql, params, many, context)


def _definition(name: str) -> dict:
    return {
        "schema_version": "1.0", "name": name,
        "plan": [{"step_id": "s0", "action": "transform_data",
                  "config": {"output": {"greeting": "Hello {{ inputs.name }} #{{ inputs.n }}"}}}],
        "inputs": {"schema": {"type": "object", "properties": {
            "n": {"type": "integer"}, "name": {"type": "string", "default": "bench"}}}},
        "triggers": [{"key": "hook", "type": "webhook", "config": {"rate_limit_per_minute": 100000}}],
        "execution": {"autonomy": "A4", "concurrency": "allow_parallel"},
    }  # fmt: skip


def _measure(label: str, items: list, work: Callable, top: int, out: Callable[[str], None]) -> dict:
    """Half the items plain (statements, CPU, wall), half under cProfile (Python calls, and the top list)."""
    statements = Statements()
    commit = connection.commit
    commits = 0

    def counted_commit() -> None:
        nonlocal commits
        commits += 1
        commit()

    half = max(1, len(items) // 2)
    plain, profiled = items[:half], items[half:]
    connection.commit = counted_commit  # BEGIN/COMMIT round trips do not pass the execute wrapper
    try:
        with connection.execute_wrapper(statements):
            cpu = time.process_time()
            wall = time.perf_counter()
            results = [work(item) for item in plain]
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
    finally:
        del connection.commit
    profiler = cProfile.Profile()
    profiler.enable()
    results += [work(item) for item in profiled]
    profiler.disable()
    stats = pstats.Stats(profiler)
    n, calls = len(plain), stats.total_calls / max(1, len(profiled))  # type: ignore[attr-defined]
    kinds = ", ".join(f"{kind} {count / n:g}" for kind, count in statements.kinds.most_common())
    out(f"{label}: {statements.total / n:.2f} statements + {commits / n:.2f} transactions, "
        f"{calls:,.0f} Python function calls, {cpu / n * 1000:.2f} ms CPU, {wall / n * 1000:.2f} ms wall "
        f"per item (n={n}; calls from {len(profiled)} more under cProfile)")  # fmt: skip
    out(f"  statements: {kinds}")
    if top:
        stream = io.StringIO()
        stats.stream = stream  # type: ignore[attr-defined]
        stats.sort_stats("cumulative").print_stats(top)
        out(stream.getvalue())
    return {"statements": statements.total / n, "transactions": commits / n, "calls": calls,
            "cpu_ms": cpu / n * 1000, "results": results}  # fmt: skip


def run(n: int = 200, top: int = 0, out: Callable[[str], None] = print) -> dict[str, float]:
    workspace = workspace_get_or_create(slug="bench-profile")
    automation = services.automation_create(workspace=workspace, definition=_definition(
        f"profile {uuid.uuid4().hex[:6]}"))  # fmt: skip
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation))
    client = Client()
    path = f"/api/v1/automations/{automation.pk}/fire"

    def fire(i: int) -> str:
        response = client.post(path, b'{"n": %d}' % i, content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {token}")  # fmt: skip
        if response.status_code != 202:
            raise RuntimeError(f"fire answered {response.status_code}: {response.content[:200]!r}")
        return response.json()["run_id"]

    me = worker_id()

    def execute(run_id: str) -> str | None:
        status = executor.execute_run(run_id, me)
        if status != "succeeded":
            raise RuntimeError(f"run {run_id} ended {status}")
        return status

    for i in range(5):  # warm caches (validators, templates, connections) before counting
        execute(fire(-i))
    fired = _measure("webhook fire (HTTP stack in-process)", list(range(n)), fire, top, out)
    executed = _measure("one-step run execution (claim → finish)", fired["results"], execute, top, out)
    for queue in QUEUES:  # the fires' execute messages: these runs were executed here
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)
    return {f"{name}_{key}": figures[key] for name, figures in (("fire", fired), ("run", executed))
            for key in ("statements", "transactions", "calls", "cpu_ms")}  # fmt: skip
