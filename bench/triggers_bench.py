"""Benchmarks of the trigger paths (SPEC §13), called by ``manage.py bench``.

Both functions use the configured database and broker and assume live workers
consume the ``automations_fast`` queue (and ``default``). They create their own
workspace, automations and triggers, and delete them afterwards (audit rows stay:
the ledger is append-only).

- :func:`bench_webhook_fire`: ``POST /automations/{id}/fire`` → run ``succeeded`` for a
  one-step ``transform_data`` plan. Latency is measured two ways, sequentially (one
  client): from the run's own ``created_at``/``finished_at``, and from the client's
  clock (fire, then poll ``GET /runs/{id}`` until it succeeded). Throughput: ``n`` fires
  from ``clients`` concurrent clients, runs/s = n / (last ``finished_at`` − first
  ``created_at``), with every non-2xx answer counted as an error.
- :func:`bench_event_matching`: the time to match one event against its workspace's
  triggers, with 0, 1,000 and 10,000 triggers subscribed to *other* event types. The
  subscriber lookup is indexed on (workspace, event_type), so the three figures should
  be the same; ``growth`` is the 10,000-case p50 over the 0-case p50.

Requests go through Django's WSGI handler in-process (``django.test.Client``) unless
``base_url`` names a running server, in which case ``httpx`` is used.
"""

from __future__ import annotations

import statistics
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from django.db import connection

ONE_STEP_PLAN = [
    {"step_id": "echo", "action": "transform_data", "config": {"output": {"n": "{{ inputs.n }}"}}}
]


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def _summary_ms(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50_ms": _ms(_percentile(values, 0.50)),
        "p90_ms": _ms(_percentile(values, 0.90)),
        "p99_ms": _ms(_percentile(values, 0.99)),
        "mean_ms": _ms(statistics.fmean(values)) if values else None,
        "max_ms": _ms(max(values)) if values else None,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


class _Http:
    """Fire and poll, in-process or against ``base_url``; one instance per thread."""

    def __init__(self, base_url: str | None, api_token: str):
        self.base_url = base_url
        self.api_token = api_token
        if base_url:
            import httpx

            self.client = httpx.Client(base_url=base_url, timeout=30)
        else:
            from django.test import Client

            self.client = Client()

    def fire(self, automation_id: str, token: str, body: bytes) -> tuple[int, dict]:
        path = f"/api/v1/automations/{automation_id}/fire"
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        if self.base_url:
            response = self.client.post(path, content=body, headers=headers)
            return response.status_code, response.json()
        response = self.client.generic("POST", path, body, content_type="application/json",
                                       HTTP_AUTHORIZATION=headers["Authorization"])  # fmt: skip
        return response.status_code, response.json()

    def run_status(self, run_id: str) -> str:
        path = f"/api/v1/runs/{run_id}"
        if self.base_url:
            response = self.client.get(path, headers={"Authorization": f"Token {self.api_token}"})
        else:
            response = self.client.get(path, HTTP_AUTHORIZATION=f"Token {self.api_token}")
        return response.json().get("status", "")

    def close(self) -> None:
        if self.base_url:
            self.client.close()
        connection.close()


def _setup(slug: str, definitions: list[dict]) -> tuple[Any, list[Any], str]:
    from automations import services
    from workspaces.models import Role
    from workspaces.services import api_token_create, workspace_get_or_create

    workspace = workspace_get_or_create(slug=slug)
    api_token = api_token_create(username=f"{slug}-user", workspace_slug=slug, role=Role.OPERATOR)
    automations = [services.automation_create(workspace=workspace, definition=body) for body in definitions]
    return workspace, automations, api_token


def _teardown(workspace, automations) -> None:
    from automations import services
    from automations.models import Run
    from triggers.models import Trigger

    for automation in automations:
        Run.objects.filter(automation=automation).delete()
        Trigger.objects.filter(automation=automation).delete()
        try:
            services.automation_archive(automation=automation)
            services.automation_purge(automation=automation)
        except services.RunActionRefused:
            pass


def _wait(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def bench_webhook_fire(
    n: int, clients: int = 8, *, latency_samples: int | None = None, base_url: str | None = None,
    timeout: float = 300.0, poll_interval: float = 0.001,
) -> dict[str, Any]:  # fmt: skip
    """Webhook fire → succeeded latency (server and client view) and sustained runs/s."""
    from automations.models import Run, RunStatus
    from triggers.models import Trigger
    from triggers.services import trigger_token_rotate

    slug = f"bench-webhook-{uuid.uuid4().hex[:8]}"
    definition = {
        "schema_version": "1.0", "name": "bench webhook", "plan": ONE_STEP_PLAN,
        "triggers": [{"key": "hook", "type": "webhook", "config": {"rate_limit_per_minute": 100000}}],
        "execution": {"autonomy": "A4"},
    }  # fmt: skip
    workspace, (automation,), api_token = _setup(slug, [definition])
    try:
        token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation))
        automation_id = str(automation.pk)

        # 1. latency, one client: fire, then poll until succeeded
        samples = latency_samples if latency_samples is not None else min(n, 200)
        http = _Http(base_url, api_token)
        client_latency, latency_run_ids, errors = [], [], 0
        try:
            for i in range(samples):
                started = time.perf_counter()
                status, body = http.fire(automation_id, token, b'{"n": %d}' % i)
                if status != 202:
                    errors += 1
                    continue
                run_id = body["run_id"]
                deadline = time.monotonic() + timeout
                state = ""
                while time.monotonic() < deadline:
                    state = http.run_status(run_id)
                    if state in ("succeeded", "failed", "cancelled", "timed_out", "needs_attention"):
                        break
                    time.sleep(poll_interval)
                if state == "succeeded":
                    client_latency.append(time.perf_counter() - started)
                    latency_run_ids.append(run_id)
                else:
                    errors += 1
        finally:
            http.close()
        server_latency = [
            (finished - created).total_seconds()
            for created, finished in Run.objects.filter(pk__in=latency_run_ids).values_list(
                "created_at", "finished_at"
            )
        ]

        # 2. throughput: n fires from `clients` threads, then wait for every run to finish
        counter = iter(range(n))
        lock = threading.Lock()
        run_ids: list[str] = []
        fire_errors = [0]

        def client_loop() -> None:
            local = _Http(base_url, api_token)
            try:
                while True:
                    with lock:
                        i = next(counter, None)
                    if i is None:
                        return
                    try:
                        status, body = local.fire(automation_id, token, b'{"n": %d}' % i)
                    except Exception:
                        status, body = 0, {}
                    with lock:
                        if status == 202:
                            run_ids.append(body["run_id"])
                        else:
                            fire_errors[0] += 1
            finally:
                local.close()

        fired_at = time.perf_counter()
        with ThreadPoolExecutor(max_workers=clients) as pool:
            for _ in range(clients):
                pool.submit(client_loop)
        fire_seconds = time.perf_counter() - fired_at
        done = _wait(lambda: not Run.objects.filter(pk__in=run_ids).exclude(status__in=[
            RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT,
            RunStatus.NEEDS_ATTENTION]).exists(), timeout)  # fmt: skip
        rows = list(Run.objects.filter(pk__in=run_ids).values_list("status", "created_at", "finished_at"))
        succeeded = [
            (created, finished) for status, created, finished in rows if status == RunStatus.SUCCEEDED
        ]
        span = (
            (max(f for _, f in succeeded) - min(c for c, _ in succeeded)).total_seconds()
            if succeeded
            else None
        )
        return {
            "n": n,
            "clients": clients,
            "latency": {
                "server": _summary_ms(server_latency),
                "client": _summary_ms(client_latency),
                "errors": errors,
            },
            "throughput": {
                "fired": len(run_ids),
                "succeeded": len(succeeded),
                "errors": fire_errors[0] + (len(rows) - len(succeeded)),
                "all_finished": done,
                "fire_seconds": round(fire_seconds, 3),
                "runs_per_second": round(len(succeeded) / span, 1) if span else None,
                "fires_per_second": round(len(run_ids) / fire_seconds, 1) if fire_seconds else None,
            },
        }
    finally:
        _teardown(workspace, [automation])


def bench_event_matching(
    subscribed: int = 10, unsubscribed: int = 10000, *, levels: tuple[int, ...] | None = None, iterations: int = 200,
) -> dict[str, Any]:  # fmt: skip
    """Time to match one event against its subscribers, as non-subscribed triggers are added.

    The subscribers' filters are evaluated but do not match (a run would measure the
    dispatcher, not matching). The non-subscribed triggers are inserted in bulk on one
    automation (benchmark setup; the matcher only reads Trigger rows).
    """
    from automations.events import Event
    from automations.models import Automation
    from triggers import matching
    from triggers.models import Trigger, TriggerType

    levels = levels or tuple(sorted({0, min(1000, unsubscribed), unsubscribed}))
    slug = f"bench-events-{uuid.uuid4().hex[:8]}"
    per_automation = 20  # the definition schema's maximum number of triggers
    definitions = []
    for a in range(0, subscribed, per_automation):
        triggers = [
            {
                "key": f"sub-{i}",
                "type": "event",
                "config": {
                    "event_type": "bench.ping",
                    "filter": {
                        "$and": [
                            {"path": "payload.kind", "equals": "order"},
                            {"path": "payload.n", "gt": 10**9},
                            {"path": "payload.name", "regex": "^[a-z]+-[0-9]+$"},
                        ]
                    },
                },
            }  # fmt: skip
            for i in range(a, min(a + per_automation, subscribed))
        ]
        definitions.append({"schema_version": "1.0", "name": f"subscriber {a}", "plan": ONE_STEP_PLAN,
                            "triggers": triggers})  # fmt: skip
    definitions.append({"schema_version": "1.0", "name": "noise", "plan": ONE_STEP_PLAN})
    workspace, automations, _ = _setup(slug, definitions)
    noise: Automation = automations[-1]
    event = Event(id=str(uuid.uuid4()), workspace_id=workspace.id, event_type="bench.ping", source="bench",
                  payload={"kind": "order", "n": 5, "name": "alpha-42"}, trace_id=uuid.uuid4().hex,
                  chain_depth=0, parent_run_id=None)  # fmt: skip
    results: dict[str, Any] = {"subscribed": subscribed, "iterations": iterations, "levels": {}}
    try:
        present = 0
        for level in levels:
            if level > present:
                Trigger.objects.bulk_create(
                    [Trigger(automation=noise, workspace=workspace, key=f"noise-{i}", type=TriggerType.EVENT,
                             config={"event_type": f"noise.{i % 500}", "filter": {"path": "payload.n", "gt": 0}},
                             config_hash=f"{i:064x}", event_type=f"noise.{i % 500}", enabled=True)
                     for i in range(present, level)],
                    batch_size=1000,
                )  # fmt: skip
                present = level
            assert len(matching.subscribers(event)) == subscribed
            for _ in range(10):  # warm the compiled-filter cache and the connection
                matching.event_matched(event)
            timings = []
            for _ in range(iterations):
                started = time.perf_counter()
                run_ids = matching.event_matched(event)
                timings.append(time.perf_counter() - started)
                assert not run_ids
            results["levels"][level] = _summary_ms(timings)
        base = results["levels"][levels[0]]["p50_ms"]
        top = results["levels"][levels[-1]]["p50_ms"]
        results["growth"] = round(top / base, 3) if base else None
        return results
    finally:
        Trigger.objects.filter(automation=noise).delete()
        _teardown(workspace, automations)


def bench_filter_worst_case(iterations: int = 30) -> dict[str, Any]:
    """CPU time to evaluate the costliest filters that save-time validation accepts (issue 12).

    Pure: no database. Each candidate is compiled afresh for every evaluation (a cold RE2
    DFA is the expensive case) and evaluated against a ~64 KB payload built to make it do
    the most work: every regex subject sits just under the filter's regex subject limit and
    is random text over the pattern's alphabet, every string ``contains`` scans a 64 KB
    string, every ``in`` list is at its maximum length and is scanned to the end.
    """
    import json
    import random

    from automations.expressions.filter_grammar import (
        MAX_CONDITIONS,
        MAX_LIST_LENGTH,
        MAX_SUBJECT_LENGTH,
        FilterBudgetExceeded,
        compile_filter,
        validate_filter,
    )

    rng = random.Random(0)

    def ab(length: int) -> str:
        return "".join(rng.choices("ab", k=length))

    def regexes(count: int, repeat: int) -> dict[str, Any]:
        return {"$or": [{"path": f"payload.r{i}", "regex": f"[ab]*a[ab]{{{repeat}}}c"} for i in range(count)]}

    candidates: dict[str, dict[str, Any]] = {
        "one regex of 300 instructions": regexes(1, 293),
        "five regexes of 57 instructions": regexes(5, 50),
        "thirty small regexes": regexes(30, 3),
        "64 conditions: 2 regexes, 31 contains, 31 in-lists": {
            "$or": [
                *regexes(2, 140)["$or"],
                *({"path": "payload.text", "contains": "needle"} for _ in range(31)),
                *(
                    {"path": "payload.id", "in": [f"id-{j}" for j in range(MAX_LIST_LENGTH)]}
                    for _ in range(31)
                ),
            ]
        },
    }
    results: dict[str, Any] = {"iterations": iterations, "candidates": {}}
    for name, spec in candidates.items():
        assert validate_filter(spec) == [], name
        assert str(spec).count("'path'") <= MAX_CONDITIONS
        limit = compile_filter(spec).regex_subject_limit
        payload: dict[str, Any] = {f"r{i}": ab(limit - 1) for i in range(30)}
        payload["id"] = "id-none"
        payload["text"] = "x" * max(0, MAX_SUBJECT_LENGTH - len(json.dumps(payload)) - 20)
        document = {"event_type": "bench.worst", "source": "bench", "payload": payload}
        timings, exceeded = [], 0
        for _ in range(iterations):
            compiled = compile_filter(spec)
            started = time.thread_time()
            try:
                compiled.matches(document, budget_seconds=60.0)  # measure, do not stop
            except FilterBudgetExceeded:
                exceeded += 1
            timings.append(time.thread_time() - started)
        summary = _summary_ms(timings)
        summary["payload_bytes"] = len(json.dumps(payload))
        summary["regex_subject_limit"] = limit
        results["candidates"][name] = summary
    results["worst_max_ms"] = max(c["max_ms"] for c in results["candidates"].values())
    return results
