"""Web and workers behind PgBouncer in transaction mode (Debian's 1.18), prepared statements off.

A transaction-mode pooler runs each transaction on whichever server session is free, so a
statement one transaction PREPAREd is missing (or already there) in the next: before
``AUTOPLANE_PREPARED_STATEMENTS`` existed, 25 of 200 webhook fires through such a pooler
answered 500. With ``DATABASE_POOLER=transaction`` (which turns the switch off) the real web
server (as ``manage.py up`` starts it) and real workers share two server sessions through a
private pgbouncer: every fire is accepted, every run succeeds, and no server session holds a
prepared statement.
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from automations import services
from automations.models import FINAL_RUN_STATUSES, Run, RunStatus
from config.celery import QUEUES
from ops.management.commands.up import build_specs
from tests.factories import definition, transform, webhook
from tests.live import live_worker_env, wait_for
from triggers.models import Trigger
from triggers.services import trigger_token_rotate

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)
FIRES = 200
SERVER_SESSIONS = 2  # default_pool_size: web's threads and the workers' processes share two sessions

pytestmark = [
    pytest.mark.workers,
    pytest.mark.timeout(300),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PgBouncer: the PostgreSQL lane"),
    pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed (apt-get install pgbouncer)"),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unprivileged_user() -> str:
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    pytest.skip("no unprivileged user for pgbouncer to run as")


class Bouncer:
    """A private pgbouncer on a free port in front of the test database's server."""

    def __init__(self, workdir: Path):
        params = connection.settings_dict
        self.user = params.get("USER") or "postgres"
        self.password = params.get("PASSWORD") or ""
        self.database = params["NAME"]
        self.port = _free_port()
        server = (
            f"host={params.get('HOST') or '127.0.0.1'} port={params.get('PORT') or 5432} user={self.user}"
        )
        if self.password:
            server += f" password={self.password}"
        self.ini = workdir / "pgbouncer.ini"
        self.ini.write_text(
            "[databases]\n"
            f"* = {server}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {SERVER_SESSIONS}\n"
            "reserve_pool_size = 0\n"
            "max_client_conn = 500\n"
            "query_wait_timeout = 60\n"
        )
        self.log_path = workdir / "pgbouncer.log"  # its stderr: it logs there when not a daemon
        argv = [PGBOUNCER, str(self.ini)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root; it reads its ini before switching
            argv[1:1] = ["-u", _unprivileged_user()]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)  # fmt: skip
        wait_for(self._answers, timeout=30, what="pgbouncer to accept connections", interval=0.05)

    @property
    def url(self) -> str:
        auth = f"{self.user}:{self.password}" if self.password else self.user
        return f"postgres://{auth}@127.0.0.1:{self.port}/{self.database}"

    def connect(self):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, password=self.password or None,
                               dbname=self.database, autocommit=True)  # fmt: skip

    def _answers(self) -> bool:
        assert self.process.poll() is None, f"pgbouncer exited:\n{self.log_path.read_text(errors='replace')}"
        try:
            with self.connect() as conn:
                conn.execute("SELECT 1")
        except Exception:  # noqa: BLE001 - not listening yet
            return False
        return True

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def bouncer():
    # Its own directory, readable by the user pgbouncer switches to (tmp_path's parents are not).
    workdir = Path(tempfile.mkdtemp(prefix="autoplane-pgbouncer-"))
    workdir.chmod(0o755)
    running = Bouncer(workdir)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def web_behind(transactional_db):
    """The web server exactly as ``manage.py up`` runs it, with the given environment."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str]) -> int:
        port = _free_port()
        (web,) = [spec for spec in build_specs(host="127.0.0.1", port=port, concurrency=dict.fromkeys(QUEUES, 1),
                                               web_workers=2) if spec.name == "web"]  # fmt: skip
        log = open(Path(env["AUTOPLANE_DATA_DIR"]) / "logs" / f"web-{port}.log", "ab")  # noqa: SIM115
        started.append(subprocess.Popen(web.argv, cwd=web.cwd, env=env, start_new_session=True,
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))  # fmt: skip
        log.close()

        def answers() -> bool:
            assert started[-1].poll() is None, "the web server exited"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                conn.close()
            except OSError:
                return False
            return True

        wait_for(answers, timeout=90, what="the web server to answer", interval=0.1)
        return port

    yield start
    for process in started:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _fire_all(port: int, automation_id, token: str, count: int, clients: int = 8) -> list[tuple[int, dict]]:
    def fire_some(numbers: range) -> list[tuple[int, dict]]:
        answers = []
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for n in numbers:
            conn.request("POST", f"/api/v1/automations/{automation_id}/fire", body=json.dumps({"n": n}),
                         headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            body = response.read()
            try:
                answers.append((response.status, json.loads(body)))
            except ValueError:
                answers.append((response.status, {"body": body.decode(errors="replace")[:200]}))
        conn.close()
        return answers

    with ThreadPoolExecutor(clients) as pool:
        parts = pool.map(fire_some, [range(i, count, clients) for i in range(clients)])
    return [answer for part in parts for answer in part]


def _server_sessions_prepared(bouncer: Bouncer) -> dict[int, int]:
    """``{backend pid: prepared statements}`` for every server session behind the bouncer: as many
    clients as the pool has sessions each hold a transaction open, so each holds another session."""
    conns = [bouncer.connect() for _ in range(SERVER_SESSIONS)]
    try:
        seen = {}
        for conn in conns:
            conn.execute("BEGIN")
            pid, count = conn.execute(
                "SELECT pg_backend_pid(), count(*) FROM pg_prepared_statements"
            ).fetchone()
            seen[pid] = count
        for conn in conns:
            conn.execute("COMMIT")
        return seen
    finally:
        for conn in conns:
            conn.close()


def test_two_hundred_webhook_fires_through_pgbouncer_in_transaction_mode_all_succeed(
    bouncer, web_behind, worker_factory, workspace, owner
):
    # given an automation with a webhook trigger
    automation = services.automation_create(
        workspace=workspace, user=owner,
        definition=definition(transform("greet", {"hi": 1}), name="pooled",
                              triggers=[webhook(rate_limit_per_minute=100000)]),
    )  # fmt: skip
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation, key="hook"), user=owner)
    # and web and workers that reach PostgreSQL only through the transaction-mode bouncer
    env = live_worker_env(DATABASE_URL=bouncer.url, DATABASE_POOLER="transaction")
    assert "AUTOPLANE_PREPARED_STATEMENTS" not in env  # off by DATABASE_POOLER=transaction alone
    worker_factory(queues=list(QUEUES), concurrency=2, env=env)
    port = web_behind(env)

    # when 200 webhooks are fired over HTTP by 8 clients at once
    answers = _fire_all(port, automation.pk, token, FIRES)

    # then every fire is accepted and every run succeeds
    refused = [(status, body) for status, body in answers if status != 202]
    assert refused == [], f"{len(refused)} of {FIRES} fires refused, e.g. {refused[:3]}"
    run_ids = {body["run_id"] for _, body in answers}
    assert len(run_ids) == FIRES

    def all_final() -> bool:
        return Run.objects.filter(pk__in=run_ids, status__in=FINAL_RUN_STATUSES).count() == FIRES

    wait_for(all_final, timeout=180, what="the 200 runs to finish", interval=0.2)
    statuses = dict(Run.objects.filter(pk__in=run_ids).values_list("id", "status"))
    assert set(statuses.values()) == {RunStatus.SUCCEEDED}, statuses
    assert Run.objects.filter(automation=automation).count() == FIRES
    # and no server session behind the bouncer holds a prepared statement
    for _ in range(3):
        sessions = _server_sessions_prepared(bouncer)
        assert len(sessions) == SERVER_SESSIONS, sessions
        assert set(sessions.values()) == {0}, sessions
