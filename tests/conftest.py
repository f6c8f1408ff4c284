"""Suite-wide fixtures: real Celery workers on the test database and broker.

Two lanes, chosen by the environment (see README): with no ``DATABASE_URL``
the suite runs on SQLite (``var/test/``) and the SQLAlchemy broker; with
``DATABASE_URL`` / ``CELERY_BROKER_URL`` on PostgreSQL and Redis.

Worker-backed tests:

    def test_something(celery_workers):              # the shared worker, all four queues
        ...
    def test_crash(worker_factory):                   # workers of your own, stopped after the test
        worker = worker_factory(queues=["automations_fast"], concurrency=1)
        worker.kill_pool_children()

Both imply ``transactional_db``: a worker is another process and only sees
committed rows.

The shared worker runs only during tests that ask for it (``celery_workers``):
before any other test it is stopped, so a test that commits runs and publishes
their execute messages (or has the relay or the sweep publish them) cannot have
them taken and executed behind its back by a worker an earlier test left
running. Its messages stay in the broker, where the next worker to start finds
runs that no longer exist. And no other worker or beat of the session may
outlive its test: one still running when the next test starts is killed and
that test fails, naming it (``_no_stray_consumers``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
from django.conf import settings

from config.celery import QUEUES
from workspaces.models import Role
from workspaces.services import workspace_get_or_create

from . import live
from .factories import Driver, client_for, member
from .mcp_servers import HttpMcpServer

logger = logging.getLogger(__name__)


# --- SQLite flush vs the append-only audit table ------------------------------------
# Transactional tests end with a flush, which on SQLite is "DELETE FROM <table>"
# for every table; the audit ledger's append-only triggers (audit migration 0002)
# abort any DELETE on audit_auditevent, so the flush fails. Drop the triggers for
# the flush, inside its transaction, and put them back right after. (PostgreSQL
# flushes with TRUNCATE, which row triggers do not see, so it needs nothing.)
def _patch_sqlite_flush() -> None:
    from django.db.backends.sqlite3.base import DatabaseWrapper  # importing operations first is circular

    DatabaseOperations = DatabaseWrapper.ops_class

    if getattr(DatabaseOperations.sql_flush, "keeps_audit_guard", False):
        return
    guard = importlib.import_module("audit.migrations.0005_sequencer")
    checkpoints = importlib.import_module("audit.migrations.0006_checkpoint_delete_guard")
    anchored = importlib.import_module("audit.migrations.0008_truncation_anchor_guard")
    cleared = importlib.import_module("audit.migrations.0012_fill_clears_entry_hash")
    original = DatabaseOperations.sql_flush

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        statements = original(
            self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
        )
        if not statements or not {"audit_auditevent", "audit_auditcheckpoint"} & set(tables):
            return statements
        return [*guard.SQLITE_REMOVE, *checkpoints.SQLITE_REMOVE, *statements, *guard.SQLITE_INSTALL,
                *anchored.SQLITE_INSTALL, *cleared.SQLITE_INSTALL, *checkpoints.SQLITE_INSTALL]  # fmt: skip

    sql_flush.keeps_audit_guard = True
    DatabaseOperations.sql_flush = sql_flush


_patch_sqlite_flush()


# --- a clean broker per session -------------------------------------------------------
def _clean_broker() -> None:
    broker = settings.CELERY_BROKER_URL
    if broker.startswith("sqla+sqlite:") or settings.CELERY_RESULT_BACKEND.startswith("db+sqlite:"):
        for url in (broker, settings.CELERY_RESULT_BACKEND):
            if "sqlite:///" in url:
                path = Path(url.split("sqlite:///", 1)[1])
                for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
                    leftover.unlink(missing_ok=True)
    if broker.startswith(("redis://", "rediss://")):
        db = int((urlparse(broker).path or "/0").lstrip("/") or 0)
        if db == 0:
            # Never wipe what is most likely somebody's real broker.
            logger.warning("not flushing Redis db 0 before the tests; use a dedicated db (the CI uses 15)")
            return
        import redis

        redis.Redis.from_url(broker).flushdb()


@pytest.fixture(scope="session", autouse=True)
def _fresh_broker():
    _clean_broker()


def pytest_sessionfinish(session, exitstatus):
    live.kill_leftovers()


# --- workers ------------------------------------------------------------------------
class WorkerPool:
    """The session's shared worker plus any extra ones; everything is stopped at session end."""

    def __init__(self, blocker):
        self._blocker = blocker
        self.main: live.WorkerProcess | None = None
        self.extra: list[live.WorkerProcess] = []

    def ensure_main(self) -> live.WorkerProcess:
        """The shared worker: all four queues, prefork, concurrency 2 (started once, restarted if it died)."""
        if self.main is None or not self.main.alive():
            if self.main is not None:
                self.main.kill_all()
            with self._blocker.unblock():
                self.main = live.WorkerProcess(QUEUES, concurrency=2, name="session-worker").start()
        return self.main

    def stop_main(self) -> None:
        if self.main is not None:
            self.main.stop()
            self.main = None

    def start(self, queues=QUEUES, *, concurrency: int = 1, pool: str = "prefork", name: str | None = None,
              **kwargs) -> live.WorkerProcess:  # fmt: skip
        """Another worker beside the shared one, kept as the shared one is (or until ``.stop()``)."""
        with self._blocker.unblock():
            worker = live.WorkerProcess(
                queues, concurrency=concurrency, pool=pool, name=name, **kwargs
            ).start()
        self.extra.append(worker)
        return worker

    def stop_all(self) -> None:
        for worker in [*self.extra, self.main]:
            if worker is not None:
                worker.stop()
        self.extra.clear()
        self.main = None

    def running(self) -> list[live.WorkerProcess]:
        return [worker for worker in [self.main, *self.extra] if worker is not None and worker.alive()]


_POOLS: list[WorkerPool] = []  # the session's pool, once a test asked for real workers


def stop_unasked_consumers(*, asked: bool) -> list[live.LiveProcess]:
    """Stop every worker and beat of this session that a test did not ask for; returns the strays.

    ``asked``: the test uses ``celery_workers``, so the shared worker (and the pool's extra
    workers) stay up; otherwise they are stopped. Any other worker or beat still running,
    one an earlier test started and did not stop, is a stray: it is killed and returned.
    """
    kept: list[live.LiveProcess] = []
    for pool in _POOLS:
        if asked:
            kept += pool.running()
        else:
            pool.stop_all()
    strays = [process for process in live.running(kinds=("worker", "beat")) if process not in kept]
    for process in strays:
        process.kill_all()
    return strays


@pytest.fixture(autouse=True)
def _no_stray_consumers(request):
    """Before every test, no worker or beat of this session consumes unless the test asked for it
    (``stop_unasked_consumers``): a stray one fails the test, naming it."""
    if strays := stop_unasked_consumers(asked="celery_workers" in request.fixturenames):
        pytest.fail(
            "a worker or beat of an earlier test was still running (killed now; a test stops what it "
            f"starts, or uses the worker_factory / beat_process fixtures): {strays}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def celery_session_pool(django_db_setup, django_db_blocker):
    """Session-wide owner of the worker processes; use ``celery_workers`` or ``worker_factory`` in tests."""
    pool = WorkerPool(django_db_blocker)
    _POOLS.append(pool)
    yield pool
    pool.stop_all()  # before django_db_setup tears the test database down
    _POOLS.remove(pool)


@pytest.fixture
def celery_workers(transactional_db, celery_session_pool) -> WorkerPool:
    """The shared worker is running: every queue is consumed. ``.main`` is its WorkerProcess.

    Shared with the next tests that use this fixture too; any other test stops it first."""
    celery_session_pool.ensure_main()
    return celery_session_pool


@pytest.fixture
def worker_factory(request, transactional_db, celery_session_pool):
    """``worker_factory(queues=[...], concurrency=1, pool="prefork", name=None) -> WorkerProcess``.

    Workers started here are stopped when the test ends. Unless the test also
    uses ``celery_workers``, the shared worker is stopped first, so these are
    the only consumers (which worker runs a task is then up to the test).
    """
    if "celery_workers" not in request.fixturenames:
        celery_session_pool.stop_main()
    started: list[live.WorkerProcess] = []

    def start(queues=QUEUES, *, concurrency: int = 1, pool: str = "prefork", name: str | None = None,
              **kwargs) -> live.WorkerProcess:  # fmt: skip
        worker = live.WorkerProcess(queues, concurrency=concurrency, pool=pool, name=name, **kwargs)
        started.append(worker)
        return worker.start()

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture
def slow_server() -> Iterator[live.HeldServer]:
    """A local HTTP server that takes GETs and holds their answers (``arrived``, ``release``, ``url``)."""
    with live.held_server() as server:
        yield server


@pytest.fixture
def signing_key_file(settings, tmp_path) -> Path:
    """A signing key file of this test's own; nothing touches the real data directory's key.
    (The approvals and audit tests use it in every test.)"""
    from audit import signing

    key_file = tmp_path / "keys" / "signing_key.pem"
    settings.AUTOPLANE_SIGNING_KEY = ""
    settings.AUTOPLANE_SIGNING_KEY_FILE = key_file
    settings.AUTOPLANE_RETIRED_PUBLIC_KEY_FILES = []
    signing.generate_key_file(key_file)
    return key_file


@pytest.fixture
def beat_process(transactional_db):
    """``beat_process(max_interval=1) -> BeatProcess``: a running celery beat, stopped after the test."""
    started: list[live.BeatProcess] = []

    def start(**kwargs) -> live.BeatProcess:
        beat = live.BeatProcess(**kwargs)
        started.append(beat)
        return beat.start()

    yield start
    for beat in started:
        beat.stop()


# --- the one set of workspaces, people and builders (tests/factories.py) -------------------
@pytest.fixture
def workspace(db):
    """Workspace "acme". The tests' local servers (127.0.0.1) are reachable through the deployment
    allowlist (tests/settings.py): loopback is on the egress deny-list no workspace allowlist opens."""
    return workspace_get_or_create(slug="acme")


@pytest.fixture
def other_workspace(db):
    """Workspace "globex": another tenant."""
    return workspace_get_or_create(slug="globex")


@pytest.fixture
def owner(workspace):
    return member("owner", workspace, Role.ADMIN)


@pytest.fixture
def operator(workspace):
    return member("operator", workspace, Role.OPERATOR)


@pytest.fixture
def viewer(workspace):
    return member("viewer", workspace, Role.VIEWER)


@pytest.fixture
def outsider(other_workspace):
    """An admin of another workspace."""
    return member("outsider", other_workspace, Role.ADMIN)


@pytest.fixture
def people(workspace, other_workspace, owner, operator, viewer, outsider) -> SimpleNamespace:
    """Everyone at once: the two workspaces, owner, operator, viewer, outsider, and three approvers
    of ``workspace`` (alice, bob, carol)."""
    approvers = {name: member(name, workspace, Role.APPROVER) for name in ("alice", "bob", "carol")}
    return SimpleNamespace(workspace=workspace, other_workspace=other_workspace, owner=owner, operator=operator,
                           viewer=viewer, outsider=outsider, **approvers)  # fmt: skip


@pytest.fixture
def api(owner):
    return client_for(owner)


@pytest.fixture
def drive(request, db) -> Driver:
    """The real executor in-process: ``drive(run_id)`` runs a run to rest; ``drive.automation(doc)``,
    ``drive.start(automation)``, ``drive.decide(approval, user)``, ``drive.resume(run)`` (tests/factories.py)."""
    return Driver(request)


# --- a real MCP server -------------------------------------------------------------


@pytest.fixture(scope="module")
def _shared_mcp_http(tmp_path_factory) -> Iterator[HttpMcpServer]:
    server = HttpMcpServer(tmp_path_factory.mktemp("mcp") / "notes.txt").start()
    yield server
    server.stop()


@pytest.fixture
def mcp_http(_shared_mcp_http) -> HttpMcpServer:
    """The module's HTTP MCP server (default variant), with no notes written yet. Do not stop or restart it."""
    if _shared_mcp_http.process is None or _shared_mcp_http.process.poll() is not None:
        _shared_mcp_http.start()
    _shared_mcp_http.notes.unlink(missing_ok=True)
    return _shared_mcp_http
