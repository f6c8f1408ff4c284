"""Audit append throughput on the configured database (SPEC §13: >= 2,000 events/s, chain intact).

    uv run python bench/audit_append.py [--events 2000] [--processes 4]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/autoplane_bench uv run python bench/audit_append.py

Measures, each on fresh chains (ids in a reserved range, so real workspaces are untouched):

1. one process appending to one chain;
2. N processes appending to one shared chain (strictly serialised by the head-row lock);
3. N processes appending, each to its own chain (how workspaces append in parallel).

By default every append is its own transaction (the worst case: one commit per
event; ``--batch K`` appends K events per transaction, as a run step does). After
each run every chain written is verified. CPU per append (client process, plus
the PostgreSQL backend when it runs on this machine) is printed too: on a shared
machine it says more than the wall-clock rate. The rows stay in the ledger, which is
append-only; point DATABASE_URL / AUTOPLANE_DATA_DIR at a scratch database.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_WORKSPACE_BASE = 9_000_000_000  # far above any real workspace id


def _setup() -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


def backend_cpu(connection) -> float | None:
    """CPU seconds used so far by this connection's PostgreSQL backend, when it runs on this machine."""
    if connection.vendor != "postgresql":
        return 0.0
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker(barrier, results, workspace_id: int, count: int, name: str, batch: int) -> None:
    _setup()
    from django.db import connection, transaction

    from audit import writer

    connection.ensure_connection()
    writer.append(trace_id=f"bench-{name}", type="bench.warmup", summary="warm up", workspace_id=workspace_id)
    barrier.wait()
    server_cpu = backend_cpu(connection)
    client_cpu = time.process_time()
    start = time.perf_counter()
    for first in range(0, count, batch):
        with transaction.atomic(), writer.batch():  # one INSERT per transaction
            for i in range(first, min(first + batch, count)):
                writer.append(
                    trace_id=f"bench-{name}",
                    type="bench.append",
                    summary=f"{name} #{i}",
                    workspace_id=workspace_id,
                    refs={"run": i},
                    payload={"process": name, "i": i, "note": "a small but realistic payload"},
                )
    finished = time.perf_counter()
    client_cpu = time.process_time() - client_cpu
    server_after = backend_cpu(connection)
    server_cpu = None if server_cpu is None or server_after is None else server_after - server_cpu
    results.put((name, start, finished, count, client_cpu, server_cpu))
    connection.close()


def _run(label: str, workspace_ids: list[int], count: int, batch: int) -> tuple[float, str]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(workspace_ids))
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(barrier, results, ws, count, f"{label}-{i}", batch))
        for i, ws in enumerate(workspace_ids)
    ]
    for p in procs:
        p.start()
    rows = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode:
            raise SystemExit(f"a bench process failed (exit {p.exitcode})")
    started = min(r[1] for r in rows)
    finished = max(r[2] for r in rows)
    total = sum(r[3] for r in rows)
    client_us = sum(r[4] for r in rows) / total * 1e6
    cpu = f"client {client_us:.0f} us"
    if all(r[5] is not None for r in rows):
        server_us = sum(r[5] for r in rows) / total * 1e6
        cpu += f" + database {server_us:.0f} us" if server_us else " (database in-process)"
    return total / (finished - started), cpu


def _verify(workspace_ids: list[int]) -> str:
    from audit.verify import verify_all
    from audit.writer import chain_for

    result = verify_all([chain_for(ws) for ws in set(workspace_ids)])
    return f"chain intact ({result.events} events verified)" if result.ok else f"BROKEN: {result.broken}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=2000, help="appends per process")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument(
        "--batch", type=int, default=1, help="appends per transaction (default 1: one commit per event)"
    )
    args = parser.parse_args()
    _setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor} ({connection.settings_dict['NAME']}), {os.cpu_count()} CPUs")
    base = BENCH_WORKSPACE_BASE + random.randrange(10**8) * 100
    n = args.processes

    cases = [
        ("1 process, 1 chain", [base + 1]),
        (f"{n} processes, 1 shared chain", [base + 2] * n),
        (f"{n} processes, {n} chains", [base + 10 + i for i in range(n)]),
    ]
    print(f"{args.batch} append(s) per transaction; load average before: {os.getloadavg()[0]:.1f}")
    for label, workspace_ids in cases:
        rate, cpu = _run(label.split(",")[0].replace(" ", ""), workspace_ids, args.events, args.batch)
        print(f"{label:<28} {rate:8.0f} appends/s   CPU per append: {cpu:<30} {_verify(workspace_ids)}")
    print(f"load average after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
