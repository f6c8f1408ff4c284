"""Issue 18's chaos cases 0-7, as real faults against a real ``manage.py up``.

Each case asserts, from what a client and a receiver see: no run lost (every
accepted run reaches the expected final state), no non-retry-safe side effect
duplicated (counted at the recorder), and the audit ledger verifying afterwards.
Figures (runs, statuses, recovery times, client-visible errors) are printed;
``docs/operations.md`` ("What survives what") has the latest.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
from collections import Counter

import httpx
import pytest

from tests.live import descendants_of

from .platform import Platform, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]


@pytest.fixture
def full(request) -> bool:
    """Full sizes under ``-m chaos``; the quick CI sizes otherwise."""
    return "chaos" in (request.config.option.markexpr or "")


def _definition(name: str, plan: list[dict], *, signed: bool = False, timeout: int = 300) -> dict:
    config = {"require_signature": True} if signed else {}
    return {
        "schema_version": "1.0",
        "name": f"{name}-{uuid.uuid4().hex[:6]}",
        "inputs": {"schema": {"type": "object"}},
        "triggers": [{"key": "hook", "type": "webhook", "config": config}],
        "plan": plan,
        "execution": {"autonomy": "A3", "timeout_seconds": timeout, "concurrency": "allow_parallel"},
    }


def _http(step_id: str, method: str, recorder, *, timeout: int = 5, params=None, **extra) -> dict:
    """A call to the recorder; ``params`` tell it how to answer (hold, fail, fail_first)."""
    config = {"method": method, "url": recorder.url(step_id), "timeout_seconds": timeout,
              "params": {k: str(v) for k, v in (params or {}).items()}}  # fmt: skip
    return {"step_id": step_id, "action": "http_request", "config": config, **extra}


def _ledger_verifies(platform: Platform) -> None:
    result = platform.manage("audit_verify")
    assert result.returncode == 0, result.stdout + result.stderr


def _report(case: str, **figures) -> None:
    print(f"\n[chaos] {case}: " + ", ".join(f"{k}={v}" for k, v in figures.items()))


class ApiProbe:
    """Hits the API in the background; counts what a client would see go wrong."""

    def __init__(self, platform: Platform):
        self.platform = platform
        self.errors: Counter[str] = Counter()
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        while not self._stop.is_set():
            try:
                response = self.platform.api("GET", "/runs?page_size=1", timeout=10)
                if response.status_code >= 500:
                    self.errors[str(response.status_code)] += 1
            except httpx.HTTPError as exc:
                self.errors[type(exc).__name__] += 1
            self.requests += 1
            time.sleep(0.05)


# --- case 5: a signed webhook replayed with its Idempotency-Key added, removed or changed -------------


@pytest.mark.chaos_quick
def test_case5_a_replayed_signed_webhook_is_one_run(platform, full):
    from triggers.webhooks import sign

    hook = platform.automation(_definition("replay", [{"step_id": "noop", "action": "transform_data",
                                                        "config": {"output": "ok"}}], signed=True))  # fmt: skip
    secret = platform.api("POST", f"/triggers/{hook['trigger']}/rotate-signing-secret").json()[
        "signing_secret"
    ]
    deliveries = 20 if full else 4
    statuses: Counter[int] = Counter()
    runs: dict[str, set[str]] = {}
    for n in range(deliveries):
        body = f'{{"n": {n}}}'.encode()
        msg_id, stamp = f"msg_{uuid.uuid4().hex}", int(time.time())
        signed = {"webhook-id": msg_id, "webhook-timestamp": str(stamp),
                  "webhook-signature": sign(secret, msg_id, stamp, body)}  # fmt: skip
        original_key = f"key-{n}" if n % 2 else None
        for key in (original_key, "added-or-changed", None, f"another-{n}"):
            response = platform.fire(hook, content=body, key=key, headers=signed)
            statuses[response.status_code] += 1
            assert response.status_code in (200, 202), response.text
            runs.setdefault(msg_id, set()).add(response.json()["run_id"])
    _report("5 webhook replay", deliveries=deliveries, fires=sum(statuses.values()), statuses=dict(statuses),
            runs=sum(len(v) for v in runs.values()))  # fmt: skip
    assert all(len(ids) == 1 for ids in runs.values()), runs
    assert statuses == {202: deliveries, 200: 3 * deliveries}
    platform.wait_final([next(iter(ids)) for ids in runs.values()], 60)


# --- case 0: a side-effect-free step longer than the lease, two workers on its queue -----------------


@pytest.mark.chaos_quick
def test_case0_a_long_step_without_side_effects_is_never_robbed(platform, full):
    hold = 12 if full else 8  # the lease is 3 s, the sweep runs every second
    hook = platform.automation(_definition("long-get", [
        _http("slow", "GET", platform.recorder, timeout=hold + 10, params={"hold": hold}),
    ]))  # fmt: skip
    runs = [platform.fire(hook, {}).json()["run_id"] for _ in range(2 if full else 1)]

    final = platform.wait_final(runs, hold * 3 + 30)

    hits = {run: len(platform.recorder.of(run, "slow")) for run in runs}
    _report("0 long step vs lease", runs=len(runs), statuses=Counter(r["status"] for r in final.values()),
            requests_per_run=hits)  # fmt: skip
    assert all(r["status"] == "succeeded" for r in final.values()), final
    assert set(hits.values()) == {1}, hits
    assert all(r["steps"][0]["attempt"] == 1 for r in final.values())


# --- case 1: kill -9 of worker processes, pool children mid-step included ----------------------------


def _worker_pids(platform: Platform, name: str = "worker-fast") -> list[int]:
    child = platform.children().get(name) or {}
    pid = child.get("pid")
    return [pid, *descendants_of(pid)] if pid else []


@pytest.mark.chaos_quick
def test_case1_kill_9_of_workers(platform, full):
    rec = platform.recorder
    n_runs, n_kills = (100, 100) if full else (12, 6)
    plain = platform.automation(_definition("kill", [
        _http("put", "PUT", rec, params={"hold": 0.6}),
        _http("post", "POST", rec, params={"hold": 0.6}),
    ]))  # fmt: skip
    flaky = platform.automation(_definition("flaky", [
        _http("post503", "POST", rec, params={"fail": 503, "fail_first": 1}, max_retries=2, retry_backoff="none"),
    ]))  # fmt: skip
    accepted, refused = [], Counter()
    kills = 0
    with ApiProbe(platform) as probe:
        for n in range(n_runs):
            response = platform.fire(plain if n % 4 else flaky, {"n": n})
            if response.status_code == 202:
                accepted.append(response.json()["run_id"])
            else:
                refused[response.status_code] += 1
        deadline = time.monotonic() + (240 if full else 60)
        while kills < n_kills and time.monotonic() < deadline:
            pids = _worker_pids(platform)
            if pids:
                try:
                    os.kill(random.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
            time.sleep(random.uniform(0.3, 1.2))
        started = time.monotonic()
        final = platform.wait_final(accepted, 300 if full else 120)
        recovered_in = time.monotonic() - started

    statuses = Counter(r["status"] for r in final.values())
    duplicated, unknown_ok, key_changes = 0, 0, 0
    for run_id, run in final.items():
        for step in ("post", "post503"):
            hits = rec.of(run_id, step)
            if step == "post" and len(hits) > 1:
                duplicated += 1
            if step == "post503" and len({h.key for h in hits}) > 1:
                key_changes += 1
        put = rec.of(run_id, "put")
        if len({h.key for h in put}) > 1:
            key_changes += 1
        if run["status"] == "needs_attention":
            failed = [s for s in run["steps"] if s["error"]]
            assert failed[-1]["error"]["code"] == "OUTCOME_UNKNOWN", run
            assert len(rec.of(run_id, failed[-1]["step_id"])) == 1, run
            unknown_ok += 1
    _report("1 kill -9 workers", runs=len(accepted), kills=kills, statuses=dict(statuses), lost=0,
            duplicated=duplicated, key_changes=key_changes, settled_after_s=round(recovered_in, 1),
            fire_refusals=dict(refused), api_errors=dict(probe.errors), api_requests=probe.requests)  # fmt: skip
    assert not refused
    assert not probe.errors, "the API was not reachable while only workers were killed"
    assert set(statuses) <= {"succeeded", "needs_attention"}, statuses
    assert duplicated == 0
    assert key_changes == 0, "a re-sent retry-safe call (or a retry after a 503) changed its Idempotency-Key"
    _ledger_verifies(platform)


# --- case 2: the broker stopped for 5 s, then restarted empty -----------------------------------------


@pytest.mark.chaos_quick
def test_case2_the_broker_stopped_and_restarted_empty(platform, full):
    hook = platform.automation(_definition("broker", [{"step_id": "noop", "action": "transform_data",
                                                       "config": {"output": "ok"}}]))  # fmt: skip
    statuses: Counter[int] = Counter()
    accepted: list[str] = []
    stop = threading.Event()

    def fire_continuously():
        n = 0
        while not stop.is_set():
            try:
                response = platform.fire(hook, {"n": n}, key=f"b-{n}-{uuid.uuid4().hex[:6]}")
                statuses[response.status_code] += 1
                if response.status_code in (200, 202):
                    accepted.append(response.json()["run_id"])
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
            n += 1
            time.sleep(0.1)

    firing = threading.Thread(target=fire_continuously, daemon=True)
    firing.start()
    time.sleep(1.0)
    platform.redis.stop()
    time.sleep(5.0)
    platform.redis.start()  # empty: no persistence
    back = time.monotonic()
    time.sleep(2.0 if not full else 10.0)
    stop.set()
    firing.join(40)

    final, lost = platform.settle(accepted, 60)
    recovered = max((r["seen_final_at"] for r in final.values()), default=back) - back
    _report("2 broker restart", fires=sum(statuses.values()), statuses=dict(statuses), runs=len(accepted),
            final=dict(Counter(r["status"] for r in final.values())), not_final=len(lost),
            all_final_s_after_return=round(recovered, 1))  # fmt: skip
    assert not [s for s in statuses if not isinstance(s, int) or s >= 500], statuses
    assert not lost, f"{len(lost)} accepted runs never finished: {lost}"
    assert all(r["status"] == "succeeded" for r in final.values())
    assert recovered <= 15 + (10.0 if full else 2.0), (
        f"runs finished {recovered:.1f} s after the broker returned"
    )
    wait_for(platform.healthy, 60, 0.5, "healthy again")
