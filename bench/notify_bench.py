"""Approval notice latency: from the gate opening an approval to the notice handed to the SMTP server
and to the webhook receiver, through a real worker on the default queue.

Each sample is one run whose medium-risk step parks at autonomy A2, executed in this process (so
the gate runs here and its after-commit sends the deliveries to the broker); a worker on the
``default`` queue delivers them: an e-mail to a local SMTP server (aiosmtpd) and a signed POST to a
local receiver. Latency is the arrival time minus the approval's ``created_at`` (same clock).

With ``--decisions N`` it also measures **decision -> next step's start** (issue 30's target: p50
at most 3x a bare Celery round trip, measured in the same run on the same broker): N runs park on a
``require_approval`` step; each is approved in this process (half of them with an edited config,
edit-then-approve), one at a time, and the latency is until the next step's GET reaches a local
receiver, through the real path: the after-commit ``resume_run`` on the default queue, then the
run's execute message on its own queue, a worker claiming it and running the approved step and
the next one.

Standalone, after ``manage.py migrate`` (any database and broker; the PostgreSQL + Redis lane is the
one the target is for)::

    uv run python bench/notify_bench.py --approvals 200
    uv run python bench/notify_bench.py --approvals 0 --decisions 60
"""

from __future__ import annotations

import argparse
import email
import os
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class _Arrivals:
    def __init__(self) -> None:
        self.smtp: dict[str, float] = {}
        self.webhook: dict[str, float] = {}
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        approval = email.message_from_bytes(envelope.content)["X-Autoplane-Approval"]
        with self.lock:
            self.smtp.setdefault(str(approval), time.time())
        return "250 OK"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--approvals", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2, help="default-queue worker processes")
    parser.add_argument(
        "--interval", type=float, default=0.0, help="seconds between approvals (0: back to back)"
    )
    parser.add_argument("--decisions", type=int, default=0, help="decision -> next step samples (0: skip)")
    args = parser.parse_args()

    from aiosmtpd.controller import Controller

    arrivals = _Arrivals()
    smtp = Controller(arrivals, hostname="127.0.0.1", port=_free_port())
    smtp.start()

    class Receiver(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            import json

            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            with arrivals.lock:
                arrivals.webhook.setdefault(body["data"]["approval_id"], time.time())
            self.send_response(204)
            self.end_headers()

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    os.environ.update(
        EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
        EMAIL_HOST="127.0.0.1",
        EMAIL_PORT=str(smtp.port),
        # The local SMTP server and receivers are on loopback: on the egress deny-list, which only the
        # deployment opens.
        AUTOPLANE_EGRESS_ALLOWLIST=os.environ.get("AUTOPLANE_EGRESS_ALLOWLIST") or "127.0.0.1",
    )  # fmt: skip (the workers inherit these)
    import django

    django.setup()
    from django.contrib.auth import get_user_model

    from approvals.models import Approval
    from automations import executor, services
    from bench.workers import Workers
    from notifications.models import Channel
    from notifications.services import channel_create
    from workspaces.models import Role, Workspace
    from workspaces.services import membership_set_role, workspace_get_or_create

    workspace = workspace_get_or_create(slug="bench-notify")
    Workspace.objects.filter(pk=workspace.pk).update(egress_allowlist=["127.0.0.1"])
    workspace.refresh_from_db()
    User = get_user_model()
    author, _ = User.objects.get_or_create(username="bench-notify-author")
    approver, _ = User.objects.get_or_create(username="bench-notify-approver")
    User.objects.filter(pk=approver.pk).update(email="approver@bench.example")
    membership_set_role(workspace=workspace, user=author, role=Role.ADMIN)
    membership_set_role(workspace=workspace, user=approver, role=Role.APPROVER)
    Channel.objects.filter(workspace=workspace).delete()
    channel_create(workspace=workspace, user=author, kind="email", name="mail", to=["approver@bench.example"])
    port = receiver.server_address[1]
    channel_create(
        workspace=workspace, user=author, kind="webhook", name="hook", url=f"http://127.0.0.1:{port}/n"
    )
    automation = services.automation_create(workspace=workspace, user=author, definition={
        "schema_version": "1.0", "name": f"bench notify {time.time()}", "execution": {"autonomy": "A2"},
        "plan": [{"step_id": "create_item", "action": "http_request",
                  "config": {"method": "POST", "url": f"http://127.0.0.1:{port}/never"}}],
    })  # fmt: skip

    if args.decisions:
        decision_latency(args.decisions, args.concurrency)
    if not args.approvals:
        smtp.stop()
        receiver.shutdown()
        return
    ids: list[str] = []
    with Workers({"default": args.concurrency}) as workers:
        workers.wait_ready()
        for _ in range(args.approvals):
            run = services.run_create(automation=automation, inputs={}, user=author).run
            assert run is not None
            executor.execute_run(str(run.pk))
            approval = Approval.objects.filter(run_id=run.pk).values_list("pk", flat=True).first()
            if approval is not None:
                ids.append(str(approval))
            if args.interval:
                time.sleep(args.interval)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with arrivals.lock:
                if all(i in arrivals.smtp and i in arrivals.webhook for i in ids):
                    break
            time.sleep(0.1)
    created = {str(pk): at for pk, at in Approval.objects.filter(pk__in=ids).values_list("pk", "created_at")}
    for name, seen in (("smtp", arrivals.smtp), ("webhook", arrivals.webhook)):
        latencies = [(seen[i] - created[i].timestamp()) * 1000 for i in ids if i in seen]
        if latencies:
            print(f"gate -> {name}: {len(latencies)}/{len(ids)} delivered, p50 {_pct(latencies, 0.5):.0f} ms, "
                  f"p99 {_pct(latencies, 0.99):.0f} ms, max {max(latencies):.0f} ms")  # fmt: skip
        else:
            print(f"gate -> {name}: nothing delivered")
    print(f"at {datetime.now(UTC).isoformat(timespec='seconds')}, {args.concurrency} default-queue worker(s)")
    smtp.stop()
    receiver.shutdown()


def decision_latency(n: int, concurrency: int) -> None:
    """Decision -> the next step's start, p50/p99 over ``n`` sequential decisions (see the module doc)."""
    from django.contrib.auth import get_user_model

    from approvals.models import Approval
    from approvals.services import approval_decide
    from automations import executor, services
    from automations.models import Run
    from bench.engine_bench import celery_round_trips
    from bench.workers import Workers
    from config.celery import QUEUE_FAST
    from workspaces.models import Role, Workspace
    from workspaces.services import membership_set_role, workspace_get_or_create

    started: dict[str, threading.Event] = {}
    arrived: dict[str, float] = {}

    class Next(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            run_id = self.path.rsplit("/", 1)[-1]
            arrived.setdefault(run_id, time.time())
            if run_id in started:
                started[run_id].set()
            self.send_response(204)
            self.end_headers()

    receiver = ThreadingHTTPServer(("127.0.0.1", 0), Next)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    workspace = workspace_get_or_create(slug="bench-decide")  # no channels: no notices in the way
    Workspace.objects.filter(pk=workspace.pk).update(egress_allowlist=["127.0.0.1"], four_eyes=False)
    User = get_user_model()
    author, _ = User.objects.get_or_create(username="bench-decide-author")
    approver, _ = User.objects.get_or_create(username="bench-decide-approver")
    membership_set_role(workspace=workspace, user=author, role=Role.ADMIN)
    membership_set_role(workspace=workspace, user=approver, role=Role.APPROVER)
    url = f"http://127.0.0.1:{receiver.server_address[1]}/next/{{{{ run.id }}}}"
    automation = services.automation_create(workspace=workspace, user=author, definition={
        "schema_version": "1.0", "name": f"bench decide {time.time()}", "execution": {"autonomy": "A2"},
        "plan": [{"step_id": "gate", "action": "require_approval", "config": {"message": "go?"}},
                 {"step_id": "next", "action": "http_request", "config": {"method": "GET", "url": url}}],
    })  # fmt: skip
    parked: list[tuple[str, str]] = []
    for _ in range(n):
        run = services.run_create(automation=automation, inputs={}, user=author).run
        assert run is not None
        executor.execute_run(str(run.pk))
        approval = Approval.objects.filter(run_id=run.pk).values_list("pk", flat=True).get()
        parked.append((str(run.pk), str(approval)))
        started[str(run.pk)] = threading.Event()
    queue = Run.objects.get(pk=parked[0][0]).queue
    groups = {"default": concurrency, queue: 1} if queue != "default" else {"default": concurrency}
    groups.setdefault(QUEUE_FAST, 1)  # the bare round trip's queue
    latencies: dict[bool, list[float]] = {False: [], True: []}
    decided_at: dict[str, tuple[float, float, bool]] = {}
    with Workers(groups) as workers:
        workers.wait_ready()
        bare = celery_round_trips(max(30, n))
        for i, (run_id, approval_id) in enumerate(parked):
            edit = i % 2 == 1
            t0 = time.time()
            approval_decide(approval_id=approval_id, user=approver, decision="approve", via="api",
                            edited_config={"message": f"go, edited {i}"} if edit else None)  # fmt: skip
            decided_at[run_id] = (t0, time.time(), edit)
            started[run_id].wait(30)
    receiver.shutdown()
    # The next step's start is its row's started_at (set just before its handler is called); where the
    # time goes (medians): the decide call itself (committed), resume_run re-queued the run, a worker
    # claimed it and ran the approved step, the next step started, its GET reached the receiver.
    hops: dict[str, list[float]] = {"decide call": [], "resume_run re-queued it": [],
                                    "worker ran the approved step": [], "next step started": [],
                                    "its GET arrived": []}  # fmt: skip
    for run_id, (t0, t1, edit) in decided_at.items():
        run = Run.objects.get(pk=run_id)
        gate = run.steps.get(step_id="gate")
        following = run.steps.filter(step_id="next").first()
        if not (following and following.started_at and run.enqueued_at and gate.finished_at):
            continue
        latencies[edit].append((following.started_at.timestamp() - t0) * 1000)
        marks = [t0, t1, run.enqueued_at.timestamp(), gate.finished_at.timestamp(),
                 following.started_at.timestamp(), arrived.get(run_id, float("nan"))]  # fmt: skip
        for name, a, b in zip(hops, marks, marks[1:], strict=False):
            hops[name].append((b - a) * 1000)
    print(
        "  where it goes (p50): "
        + "; ".join(f"{name} +{_pct(v, 0.5):.1f} ms" for name, v in hops.items() if v)
    )
    bare_p50 = _pct(bare, 0.5)
    print(f"bare celery round trip ({QUEUE_FAST}): p50 {bare_p50:.1f} ms, p99 {_pct(bare, 0.99):.1f} ms "
          f"(n={len(bare)})")  # fmt: skip
    for edit, values in latencies.items():
        label = "edit-then-approve" if edit else "approve"
        if not values:
            print(f"decision ({label}) -> next step: nothing started")
            continue
        p50 = _pct(values, 0.5)
        print(f"decision ({label}) -> next step's start: {len(values)} samples, p50 {p50:.1f} ms "
              f"({p50 / bare_p50:.1f}x the bare round trip; target <= 3x), p99 {_pct(values, 0.99):.1f} ms, "
              f"runs on {queue}")  # fmt: skip


if __name__ == "__main__":
    main()
