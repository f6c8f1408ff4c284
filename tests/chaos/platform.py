"""The chaos suite's platform: private servers, a real ``manage.py up``, and a recorder.

Everything the faults hit is private to the test, so it can be killed freely:

- :class:`PrivateRedis`: a ``redis-server`` on a free port (the broker), stopped,
  restarted empty or flushed by the tests;
- :class:`ChaosDatabase`: a database of its own on the lane's PostgreSQL,
  whose connections the tests terminate (``pg_terminate_backend``) or refuse;
- :class:`Platform`: ``manage.py up`` on those two (web, one worker per queue,
  beat), as an operator runs it, with the recovery intervals short;
- :class:`Recorder`: the local HTTP server the automations' steps call. It
  counts every request it *receives* per ``/rec/<run>/<step>`` with its method
  and ``Idempotency-Key``, before answering, so a call whose worker dies while
  the recorder holds it still counts.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import psycopg
from psycopg import sql

REPO = Path(__file__).resolve().parent.parent.parent
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request drowns the figures
FINAL = {"succeeded", "failed", "cancelled", "timed_out", "needs_attention"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, interval: float = 0.1, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; raise after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def tools_missing() -> list[str]:
    return [tool for tool in ("redis-server", "redis-cli") if shutil.which(tool) is None]


class PrivateRedis:
    def __init__(self, directory: Path):
        self.port = free_port()
        self.directory = directory
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.directory), "--logfile", str(self.directory / "redis.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(self.ping, 10, what="redis-server")

    def cli(self, *args: str) -> str:
        result = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=10
        )
        return result.stdout.strip()

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """The broker goes away at once (SIGKILL): whatever it held is lost."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        wait_for(lambda: not self.ping(), 10, what="redis-server to stop")


class ChaosDatabase:
    """A database of its own on the lane's PostgreSQL server (``<DATABASE_URL's name>_chaos``).

    Created empty for each platform; its connections, and only its, are the
    ones the database faults terminate. (A throwaway ``initdb`` cluster would
    also allow a server restart, but ``initdb`` refuses to run as root, which is
    how CI runs.)
    """

    def __init__(self, server_url: str):
        parsed = urlparse(server_url)
        if parsed.scheme not in ("postgres", "postgresql", "pgsql"):
            raise ValueError("the chaos suite needs DATABASE_URL to point at PostgreSQL")
        self.name = f"{parsed.path.lstrip('/') or 'autoplane'}_chaos"
        self.server = parsed
        self.url = parsed._replace(path=f"/{self.name}").geturl()
        self.admin_url = parsed._replace(path="/postgres").geturl()

    def start(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (self.name,)
            )
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))

    def terminate_connections(self) -> int:
        """Kill every connection to the platform's database (and only to it)."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                (self.name,),
            ).fetchone()
        return int(row[0])

    def block_connections(self, blocked: bool) -> None:
        """Refuse (or allow again) new connections to the platform's database: the database is "down"."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}").format(
                    sql.Identifier(self.name), sql.SQL("false" if blocked else "true")
                )
            )

    def stop(self) -> None:
        try:
            self.block_connections(False)
            self.terminate_connections()
        except psycopg.Error:
            pass


@dataclass
class Hit:
    method: str
    run: str
    step: str
    key: str | None
    at: float


class Recorder:
    """``/rec/<run>/<step>?hold=S&fail=STATUS&fail_first=N``: count, hold, answer."""

    def __init__(self):
        self.hits: list[Hit] = []
        self.lock = threading.Lock()
        self.seen: dict[tuple[str, str], int] = defaultdict(int)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                url = urlparse(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                parts = url.path.strip("/").split("/")
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                status = 200
                if len(parts) == 3 and parts[0] == "rec":
                    run, step = parts[1], parts[2]
                    with recorder.lock:
                        recorder.hits.append(Hit(self.command, run, step, self.headers.get("Idempotency-Key"),
                                                 time.monotonic()))  # fmt: skip
                        recorder.seen[(run, step)] += 1
                        nth = recorder.seen[(run, step)]
                    if "fail" in query and nth <= int(query.get("fail_first", 1)):
                        status = int(query["fail"])
                    if "hold" in query:
                        time.sleep(float(query["hold"]))
                body = json.dumps({"ok": status < 400}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the caller died while we held it

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, step: str) -> str:
        """The URL a step calls (a template: the run's id is filled in by the engine)."""
        return f"http://127.0.0.1:{self.port}/rec/{{{{ run.id }}}}/{step}"

    def of(self, run: str, step: str | None = None) -> list[Hit]:
        with self.lock:
            return [h for h in self.hits if h.run == run and (step is None or h.step == step)]

    def close(self) -> None:
        self.server.shutdown()


class Platform:
    """``manage.py up`` on a private PostgreSQL cluster and Redis, driven over HTTP."""

    INTERVALS = {
        "AUTOPLANE_RUN_LEASE_SECONDS": "3",
        "AUTOPLANE_SWEEP_SECONDS": "1",
        "AUTOPLANE_REQUEUE_AFTER_SECONDS": "5",
        "AUTOPLANE_RELAY_SECONDS": "1",
        "AUTOPLANE_RELAY_AFTER_SECONDS": "2",
    }

    def __init__(self, directory: Path, database_url: str, *, concurrency: str = "fast=2,medium=2,long=2,default=1",
                 **env: str):  # fmt: skip
        self.directory = directory
        self.redis = PrivateRedis(directory / "redis")
        self.postgres = ChaosDatabase(database_url)
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.concurrency = concurrency
        self.extra_env = env
        self.proc: subprocess.Popen | None = None
        self.token = ""
        self.log_path = directory / "up.log"
        self.client = httpx.Client(timeout=30)
        self.recorder = Recorder()

    @property
    def env(self) -> dict[str, str]:
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_", "AUTOPLANE_"))
        }
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings",
            DATABASE_URL=self.postgres.url,
            CELERY_BROKER_URL=self.redis.url,
            CELERY_RESULT_BACKEND=self.redis.url.replace("/0", "/1"),
            AUTOPLANE_DATA_DIR=str(self.directory / "data"),
            AUTOPLANE_EGRESS_ALLOWLIST="127.0.0.1",
            AUTOPLANE_SIGNING_KEY_AUTOGENERATE="true",
            AUTOPLANE_SANDBOX_BACKEND="bubblewrap" if shutil.which("bwrap") else "subprocess",
            AUTOPLANE_SANDBOX_INSECURE="false" if shutil.which("bwrap") else "true",
            PYTHONUNBUFFERED="1",
            **self.INTERVALS,
        )
        env.update(self.extra_env)
        return env

    def start(self, timeout: float = 300) -> None:
        self.redis.start()
        self.postgres.start()
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "up", "--port", str(self.port), "--concurrency", self.concurrency,
             "--web-workers", "2", "--stop-timeout", "5"],
            cwd=REPO, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.token = wait_for(self._token, timeout, 0.5, "up to print the API token")
        wait_for(self.healthy, timeout, 0.5, "/healthz 200")

    def _token(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"up exited with {self.proc.returncode}; see {self.log_path}")
        match = re.search(r"API token\s+(\S+)", self.log_path.read_text(errors="replace"))
        return match.group(1) if match else None

    def healthy(self) -> bool:
        try:
            return self.client.get(f"{self.base}/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.client.close()
        self.recorder.close()
        self.postgres.stop()
        self.redis.stop() if self.redis.ping() else None

    # --- the API, as a client uses it ------------------------------------------------------
    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Token {self.token}", **kwargs.pop("headers", {})}
        return self.client.request(method, f"{self.base}/api/v1{path}", headers=headers, **kwargs)

    def automation(self, definition: dict) -> dict:
        """Create an automation; returns ``{"id", "trigger", "token"}`` for its webhook trigger."""
        response = self.api("POST", "/automations", json=definition)
        assert response.status_code == 201, response.text
        automation = response.json()["id"]
        triggers = self.api("GET", f"/automations/{automation}/triggers").json()
        trigger = (triggers.get("results", triggers) if isinstance(triggers, dict) else triggers)[0]["id"]
        token = self.api("POST", f"/triggers/{trigger}/rotate-token").json()["token"]
        return {"id": automation, "trigger": trigger, "token": token}

    def fire(self, hook: dict, body: dict | None = None, *, key: str | None = None,
             headers: dict | None = None, content: bytes | None = None) -> httpx.Response:  # fmt: skip
        extra = {
            "Authorization": f"Bearer {hook['token']}",
            "Content-Type": "application/json",
            **(headers or {}),
        }
        if key is not None:
            extra["Idempotency-Key"] = key
        payload = content if content is not None else json.dumps(body or {}).encode()
        return self.client.post(f"{self.base}/api/v1/automations/{hook['id']}/fire", content=payload,
                                headers=extra, timeout=30)  # fmt: skip

    def run(self, run_id: str) -> dict:
        return self.api("GET", f"/runs/{run_id}").json()

    def settle(self, run_ids, timeout: float) -> tuple[dict[str, dict], dict[str, str]]:
        """Poll until every run is final or ``timeout`` passes: (final runs, status of the others)."""
        pending, done = set(run_ids), {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for run_id in list(pending):
                try:
                    run = self.run(run_id)
                except httpx.HTTPError:
                    continue
                if run.get("status") in FINAL:
                    run["seen_final_at"] = time.monotonic()
                    done[run_id] = run
                    pending.discard(run_id)
            time.sleep(0.2)
        return done, {run_id: self.run(run_id).get("status", "?") for run_id in pending}

    def wait_final(self, run_ids, timeout: float) -> dict[str, dict]:
        """Every run's final state; raises naming the runs still unfinished after ``timeout``."""
        done, pending = self.settle(run_ids, timeout)
        if pending:
            raise AssertionError(
                f"{len(pending)} runs not final after {timeout:.0f} s: {dict(list(pending.items())[:10])}"
            )
        return done

    # --- the processes ---------------------------------------------------------------------
    def children(self) -> dict[str, dict]:
        path = self.directory / "data" / f"up-{self.port}.state.json"
        try:
            return json.loads(path.read_text())["children"]
        except (OSError, ValueError, KeyError):
            return {}

    def manage(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip
