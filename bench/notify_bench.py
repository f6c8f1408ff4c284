"""Approval notice latency: from the gate opening an approval to the notice handed to the SMTP server
and to the webhook receiver, through a real worker on the default queue.

Each sample is one run whose medium-risk step parks at autonomy A2, executed in this process (so
the gate runs here and its after-commit sends the deliveries to the broker); a worker on the
``default`` queue delivers them: an e-mail to a local SMTP server (aiosmtpd) and a signed POST to a
local receiver. Latency is the arrival time minus the approval's ``created_at`` (same clock).

Standalone, after ``manage.py migrate`` (any database and broker; the PostgreSQL + Redis lane is the
one the target is for)::

    uv run python bench/notify_bench.py --approvals 200
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


if __name__ == "__main__":
    main()
