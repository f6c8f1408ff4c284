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
import re
import signal
import threading
import time
import uuid
from collections import Counter

import httpx
import psycopg
import pytest

from ops.supervisor import FLAP_WINDOW
from tests.live import descendants_of

from .platform import Platform, wait_for

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(1200)]


@pytest.fixture
def full(request) -> bool:
    """Full sizes under ``-m chaos``; the quick CI sizes under ``-m chaos_quick``."""
    return re.search(r"\bchaos\b", request.config.option.markexpr or "") is not None


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
    # Runs wait behind a worker restarted up to 100 times: their own timeout is not what is tested.
    timeout = 1200 if full else 300
    plain = platform.automation(_definition("kill", timeout=timeout, plan=[
        _http("put", "PUT", rec, params={"hold": 0.6}),
        _http("post", "POST", rec, params={"hold": 0.6}),
    ]))  # fmt: skip
    flaky = platform.automation(_definition("flaky", timeout=timeout, plan=[
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
        final = platform.wait_final(accepted, 900 if full else 120)
        recovered_in = time.monotonic() - started

    statuses = Counter(r["status"] for r in final.values())
    duplicated, key_changes = 0, 0
    unknown_sent: Counter[int] = Counter()
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
            # One request if the worker died mid-call; none if it died between the step's
            # checkpoint and the send (the platform cannot tell which: hence OUTCOME_UNKNOWN).
            sent = len(rec.of(run_id, failed[-1]["step_id"]))
            assert sent <= 1, run
            unknown_sent[sent] += 1
    _report("1 kill -9 workers", runs=len(accepted), kills=kills, statuses=dict(statuses), lost=0,
            duplicated=duplicated, key_changes=key_changes, unknown_outcome_requests=dict(unknown_sent),
            settled_after_s=round(recovered_in, 1),
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

    crashes_before = platform.log_path.read_text(errors="replace").count("Unrecoverable error")
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
    # No worker died of the outage (kombu's "'hostname'" AttributeError, config/redis_broker.py).
    assert platform.log_path.read_text(errors="replace").count("Unrecoverable error") == crashes_before
    # Within 15 s of the broker's return for the runs accepted until then, plus the time they were fired
    # for afterwards. The quick (CI) case allows 15 s more: it must not flake on a loaded CI machine,
    # and it still catches the failures it guards against (a crashed worker, runs left to the 300 s
    # sweep); the full suite keeps the 15 s.
    assert recovered <= 15 + (10.0 if full else 2.0 + 15.0), (
        f"runs finished {recovered:.1f} s after the broker returned"
    )
    # /healthz also reports a child that exited 3 times in FLAP_WINDOW as crash-looping: case 1's
    # kills, just before on the same platform, can still count.
    wait_for(platform.healthy, FLAP_WINDOW + 60, 0.5, "healthy again")


# --- case 3: FLUSHALL while runs are queued, and while events are queued ------------------------------


def test_case3_flushall_while_runs_and_events_are_queued(platform, full):
    rec = platform.recorder
    n_runs, n_events = (60, 30) if full else (20, 10)
    event_type = f"chaos.flush.{uuid.uuid4().hex[:6]}"
    hook = platform.automation(_definition("flush", [_http("post", "POST", rec, params={"hold": 0.5})]))
    on_event = _http("ev", "POST", rec)
    on_event["config"]["url"] = rec.url("ev{{ event.payload.n }}")  # counted per event
    subscribed = _definition("on-event", [on_event])
    subscribed["triggers"] = [{"key": "on", "type": "event", "config": {"event_type": event_type}}]
    created = platform.api("POST", "/automations", json=subscribed)
    assert created.status_code == 201, created.text

    runs = []
    for n in range(n_runs):  # a backlog: two pool processes, 0.5 s a run
        response = platform.fire(hook, {"n": n})
        assert response.status_code == 202, response.text
        runs.append(response.json()["run_id"])
    statuses: Counter[int] = Counter()
    for n in range(n_events):
        response = platform.api("POST", "/events", json={"event_type": event_type, "payload": {"n": n}},
                                headers={"Idempotency-Key": f"{event_type}-{n}"})  # fmt: skip
        statuses[response.status_code] += 1
    flushed_backlog = platform.redis.cli("DBSIZE")
    assert platform.redis.cli("FLUSHALL") == "OK"
    flushed = time.monotonic()

    final = platform.wait_final(runs, 120 if full else 90)
    event_runs = wait_for(
        lambda: (lambda hits: hits if len(hits) == n_events else None)(
            {h.step for h in rec.hits if h.step.startswith("ev")}
        ),
        60, 0.5, f"all {n_events} events' runs to call the recorder",
    )  # fmt: skip
    settled = time.monotonic() - flushed
    posts = Counter(len(rec.of(run_id, "post")) for run_id in runs)
    per_event = Counter(h.step for h in rec.hits if h.step.startswith("ev"))
    _report("3 FLUSHALL", runs=len(runs), events=n_events, event_answers=dict(statuses),
            redis_keys_flushed=flushed_backlog, statuses=dict(Counter(r["status"] for r in final.values())),
            requests_per_run=dict(posts), event_runs=len(event_runs), runs_per_event=dict(Counter(per_event.values())),
            all_done_s_after_flush=round(settled, 1))  # fmt: skip
    assert statuses == {202: n_events}
    assert all(r["status"] == "succeeded" for r in final.values())
    assert posts == {1: n_runs}, "a run lost or repeated its POST"
    assert set(per_event.values()) == {1}, per_event
    _ledger_verifies(platform)


# --- case 4: every database connection killed mid-load -------------------------------------------------


def test_case4_every_database_connection_killed_mid_load(platform, full):
    rec = platform.recorder
    n_runs = 40 if full else 16
    hook = platform.automation(_definition("db-kill", [
        _http("put", "PUT", rec, params={"hold": 0.3}),
        _http("post", "POST", rec, params={"hold": 0.3}),
    ]))  # fmt: skip
    answers: Counter[str] = Counter()
    accepted: dict[str, str] = {}

    def fire_until_accepted(n: int) -> None:
        key = f"db-{n}-{uuid.uuid4().hex[:6]}"
        for _ in range(120):  # a client that retries with the same key, as a 503 asks it to
            try:
                response = platform.fire(hook, {"n": n}, key=key)
                answers[str(response.status_code)] += 1
                if response.status_code in (200, 202):
                    accepted[key] = response.json()["run_id"]
                    return
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
            time.sleep(0.5)

    firing = [threading.Thread(target=fire_until_accepted, args=(n,), daemon=True) for n in range(n_runs)]
    killed = 0
    for n, thread in enumerate(firing):
        thread.start()
        if n == n_runs // 4:
            killed += platform.postgres.terminate_connections()
        time.sleep(0.1)
    time.sleep(1.0)
    # The database goes away mid-load (a restart): every connection killed, new ones refused for 3 s.
    platform.postgres.block_connections(True)
    killed += platform.postgres.terminate_connections()
    time.sleep(3.0)
    killed += platform.postgres.terminate_connections()
    platform.postgres.block_connections(False)
    back = time.monotonic()
    for thread in firing:
        thread.join(90)

    final = platform.wait_final(accepted.values(), 120)
    last_final = max(r["seen_final_at"] for r in final.values()) - back
    resumed = min((h.at for h in rec.hits if h.at > back), default=back) - back
    statuses = Counter(r["status"] for r in final.values())
    posts = Counter(len(rec.of(run_id, "post")) for run_id in accepted.values())
    _report("4 database connections killed", runs=len(accepted), connections_killed=killed, answers=dict(answers),
            statuses=dict(statuses), requests_per_run=dict(posts),
            first_call_s_after_db_back=round(resumed, 1),
            all_final_s_after_db_back=round(last_final, 1))  # fmt: skip
    assert len(accepted) == n_runs, "a fire was never accepted"
    assert not [a for a in answers if a not in ("200", "202", "503")], answers
    assert statuses == {"succeeded": n_runs}, statuses
    assert posts == {1: n_runs}, "a POST was lost or repeated"
    # The work went on within 15 s of the database's return, and the backlog drained at its own pace.
    assert resumed <= 15, f"the first call after the database returned came {resumed:.1f} s later"
    assert last_final <= 15 + n_runs * 0.6, f"runs finished {last_final:.1f} s after the database returned"
    wait_for(platform.healthy, 60, 0.5, "healthy again")
    _ledger_verifies(platform)


# --- case 6: a web worker killed between commit and publish, the client retrying with the same key ---


def test_case6_web_killed_between_commit_and_publish(platform, full):
    rec = platform.recorder
    n_fires = 8  # about the web's threads: the fires it took are held in their publish when it is killed
    hook = platform.automation(_definition("web-kill", [_http("post", "POST", rec)]))
    keys = [f"w-{n}-{uuid.uuid4().hex[:6]}" for n in range(n_fires)]
    first: dict[str, str] = {}

    def fire_once(key: str) -> None:
        try:
            first[key] = str(platform.fire(hook, {}, key=key).status_code)
        except httpx.HTTPError as exc:
            first[key] = type(exc).__name__

    # The broker stops answering (SIGSTOP): a fire commits its run, then hangs in the publish.
    os.kill(platform.redis.proc.pid, signal.SIGSTOP)
    try:
        held = [threading.Thread(target=fire_once, args=(key,), daemon=True) for key in keys]
        for thread in held:
            thread.start()
        counts: list[int] = []

        def settled() -> int | None:  # as many runs committed as the web's threads could take
            counts.append(_runs_of(platform, hook["id"]))
            return counts[-1] if counts[-1] and counts[-6:] == [counts[-1]] * 6 else None

        committed = wait_for(settled, 60, 0.5, "the held fires to commit their runs")
        web = platform.children()["web"]["pid"]
        web_workers = descendants_of(web)
        for pid in web_workers:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.kill(platform.redis.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    for thread in held:
        thread.join(30)

    retried: dict[str, str] = {}
    for key in keys:  # the client did not get an answer: it retries with the same key
        response = wait_for(lambda key=key: _fire_or_none(platform, hook, key), 60, 0.5, "web back")
        assert response.status_code in (200, 202), response.text
        retried[key] = response.json()["run_id"]
    final = platform.wait_final(retried.values(), 60)
    started = max(r["seen_final_at"] for r in final.values()) - resumed
    _report("6 web killed between commit and publish", fires=n_fires, committed_before_kill=committed,
            web_workers_killed=len(web_workers), first_answers=dict(Counter(first.values())),
            runs=len(set(retried.values())), statuses=dict(Counter(r["status"] for r in final.values())),
            requests_per_run=dict(Counter(len(rec.of(r, "post")) for r in retried.values())),
            all_final_s_after_kill=round(started, 1))  # fmt: skip
    assert _runs_of(platform, hook["id"]) == n_fires, "a retry with the same key made a second run"
    assert len(set(retried.values())) == n_fires
    assert all(r["status"] == "succeeded" for r in final.values())
    assert all(len(rec.of(r, "post")) == 1 for r in retried.values())
    assert started <= 15, f"the runs finished {started:.1f} s after the web came back"
    _ledger_verifies(platform)


def _runs_of(platform: Platform, automation: str) -> int:
    with psycopg.connect(platform.postgres.url) as conn:
        return conn.execute("SELECT count(*) FROM automations_run WHERE automation_id = %s",
                            (automation,)).fetchone()[0]  # fmt: skip


def _fire_or_none(platform: Platform, hook: dict, key: str) -> httpx.Response | None:
    try:
        response = platform.fire(hook, {}, key=key)
    except httpx.HTTPError:
        return None
    return response if response.status_code < 500 else None


# --- case 7: a poison run -------------------------------------------------------------------------------


def test_case7_a_poison_run_fails_after_the_recovery_limit(platform, full):
    """A retry-safe PUT whose worker dies every time it runs it: recovered 3 times, then failed."""
    rec = platform.recorder
    hook = platform.automation(
        _definition("poison", [_http("put", "PUT", rec, timeout=8, params={"hold": 6})])
    )
    run_id = platform.fire(hook, {}).json()["run_id"]
    kills, seen = 0, 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        run = platform.run(run_id)
        if run["status"] in ("succeeded", "failed", "needs_attention", "cancelled", "timed_out"):
            break
        hits = len(rec.of(run_id, "put"))
        if hits > seen:  # the step is running in a pool process: it dies with it
            seen = hits
            worker = platform.children()[f"worker-{run['queue'].removeprefix('automations_')}"]["pid"]
            for pid in descendants_of(worker):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            kills += 1
        time.sleep(0.1)
    run = platform.run(run_id)
    hits = rec.of(run_id, "put")
    _report("7 poison run", kills=kills, requests=len(hits), keys=len({h.key for h in hits}), status=run["status"],
            error=(run.get("error") or {}).get("code"))  # fmt: skip
    assert run["status"] == "failed", run
    assert run["error"]["code"] == "RECOVERY_LIMIT", run
    assert len(hits) == 4, "the PUT runs once, then once per recovery (3)"
    assert len({h.key for h in hits}) == 1, "a recovered retry-safe call keeps its key"
    _ledger_verifies(platform)
