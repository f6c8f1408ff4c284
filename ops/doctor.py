"""``manage.py doctor``: is this deployment healthy end to end? One line per check, with a fix.

Each check answers ``ok``, ``warn`` (works, but look at it: ``check --deploy``
advice, a sandbox that is missing so code steps fail closed) or ``fail``
(something the platform needs is broken). Failures are reported as categories
(the exception's class, ``unreachable``, ``not a valid Fernet key``...), never
with the exception's text, a URL's password or a key: the output is safe to
paste into a ticket.

The ``fast`` checks need no worker, beat or network peer (database, migrations,
keys, settings, sandbox) and are what ``manage.py up`` runs at start.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlparse

from django.conf import settings
from django.core import checks as django_checks
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from audit.sequencer import backlog as audit_backlog
from audit.signing import read_key_file, signing_key
from capabilities import credentials
from capabilities.models import McpServer
from capabilities.sandbox import backend_from_settings
from config import seams
from config.celery import QUEUES, queue_backlog
from config.celery import app as celery_app
from workspaces.checks import workspaces_without_four_eyes

from .checks import edge_advice
from .models import HeartbeatKind
from .selectors import heartbeats_fresh, last_seen, workers_by_queue

OK, WARN, FAIL = "ok", "warn", "fail"
TIMEOUT_SECONDS = 2.0
TICK_STALE_SECONDS = 60.0


@dataclass
class Finding:
    check: str
    status: str
    message: str
    fix: str = ""


def _category(exc: BaseException) -> str:
    """What went wrong, without the exception's text (it may hold a URL or a key)."""
    return type(exc).__name__


def _where(url: str) -> str:
    """``scheme://host:port/path`` of a URL, without user or password."""
    parsed = urlparse(url)
    host = parsed.hostname or ""
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{host}{port}{parsed.path}"


# --- the platform's own parts ----------------------------------------------------------


def check_database() -> Iterator[Finding]:
    db = settings.DATABASES["default"]
    where = db["NAME"] if settings.DATABASE_IS_SQLITE else f"{db.get('HOST') or 'localhost'}/{db['NAME']}"
    try:
        connection.ensure_connection()
        pending = MigrationExecutor(connection).migration_plan(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )
    except Exception as exc:
        yield Finding("database", FAIL, f"{connection.vendor} {where}: unreachable ({_category(exc)})",
                      "check DATABASE_URL and that the database server is running")  # fmt: skip
        return
    yield Finding("database", OK, f"{connection.vendor} {where} reachable")
    if pending:
        yield Finding(
            "migrations", FAIL, f"{len(pending)} migration(s) not applied", "run: manage.py migrate"
        )
    else:
        yield Finding("migrations", OK, "all applied")


def check_broker() -> Iterator[Finding]:
    where = _where(settings.CELERY_BROKER_URL)
    started = time.perf_counter()
    try:
        backlog = queue_backlog(QUEUES, TIMEOUT_SECONDS)
    except Exception as exc:
        yield Finding("broker", FAIL, f"{where}: unreachable ({_category(exc)})",
                      "check CELERY_BROKER_URL and that the broker is running")  # fmt: skip
        return
    waiting = sum(backlog.values())
    yield Finding("broker", OK, f"{where} reachable ({(time.perf_counter() - started) * 1000:.0f} ms, "
                  f"{waiting} message(s) waiting)")  # fmt: skip
    backend = settings.CELERY_RESULT_BACKEND
    if backend.startswith("rpc://"):
        yield Finding("result_backend", OK, "rpc:// (replies over the broker)")
        return
    try:
        if backend.startswith(("redis://", "rediss://")):
            celery_app.backend.client.ping()
        elif backend.startswith("db+"):
            with celery_app.backend.ResultSession() as session:
                session.connection()
    except Exception as exc:
        yield Finding("result_backend", FAIL, f"{_where(backend.removeprefix('db+'))}: unreachable "
                      f"({_category(exc)})", "check CELERY_RESULT_BACKEND")  # fmt: skip
        return
    yield Finding("result_backend", OK, f"{_where(backend.removeprefix('db+'))} reachable")


def _consumers_by_queue() -> tuple[dict[str, int], str]:
    """Live consumers of each queue: asked of the workers over the broker where it broadcasts,
    else from the workers' heartbeat rows (the embedded broker cannot broadcast)."""
    if settings.BROKER_IS_EMBEDDED:
        return workers_by_queue(QUEUES), "heartbeats"
    replies = celery_app.control.inspect(timeout=TIMEOUT_SECONDS).active_queues() or {}
    counts = dict.fromkeys(QUEUES, 0)
    for queues in replies.values():
        for name in {q.get("name") for q in queues or ()}:
            if name in counts:
                counts[name] += 1
    return counts, "celery inspect"


def check_workers() -> Iterator[Finding]:
    try:
        counts, source = _consumers_by_queue()
    except Exception as exc:
        yield Finding("workers", FAIL, f"cannot tell ({_category(exc)})", "check the broker first")
        return
    for queue, count in counts.items():
        if count:
            yield Finding(f"workers.{queue}", OK, f"{count} worker(s) consuming ({source})")
        else:
            yield Finding(f"workers.{queue}", FAIL, f"no worker consumes this queue ({source})",
                          f"start one: celery -A config worker -Q {queue}")  # fmt: skip


def check_beat() -> Iterator[Finding]:
    try:
        beats = heartbeats_fresh(kind=HeartbeatKind.BEAT).count()
        tick = last_seen(kind=HeartbeatKind.TICK)
    except Exception as exc:
        yield Finding("beat", FAIL, f"cannot read heartbeats ({_category(exc)})", "check the database first")
        return
    if beats == 0:
        yield Finding("beat", FAIL, "no beat process is running", "start exactly one: celery -A config beat")
        return
    if beats > 1:
        yield Finding("beat", FAIL, f"{beats} beat processes are running: schedules fire {beats} times",
                      "stop all but one")  # fmt: skip
        return
    age = None if tick is None else (time.time() - tick.seen_at.timestamp())
    if age is None or age > TICK_STALE_SECONDS:
        yield Finding("beat", WARN, "beat runs, but no worker executed its tick lately" if age else
                      "beat runs; no tick executed yet", "check the worker of the default queue")  # fmt: skip
        return
    yield Finding("beat", OK, f"one beat, last tick {age:.0f} s ago")


def check_sequencer() -> Iterator[Finding]:
    try:
        waiting = audit_backlog()
    except Exception as exc:
        yield Finding("audit_sequencer", FAIL, f"cannot read the audit backlog ({_category(exc)})")
        return
    if waiting.within_bound:
        yield Finding("audit_sequencer", OK, f"{waiting.entries} entries waiting, oldest "
                      f"{waiting.oldest_age_seconds:.1f} s")  # fmt: skip
    else:
        yield Finding("audit_sequencer", WARN, f"{waiting.entries} entries wait {waiting.oldest_age_seconds:.0f} s, "
                      f"over the {settings.AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS} s bound",
                      "is manage.py audit_sequencer running?")  # fmt: skip


def check_sandbox() -> Iterator[Finding]:
    try:
        backend = backend_from_settings()
        available = backend.available()
    except Exception as exc:
        yield Finding("sandbox", WARN, f"cannot start ({_category(exc)}): code steps fail closed",
                      "install bubblewrap (apt-get install bubblewrap)")  # fmt: skip
        return
    if not available:
        yield Finding("sandbox", WARN, f"{backend.name} unavailable here: code steps (run_python, run_shell) "
                      "fail closed", "install bubblewrap (apt-get install bubblewrap), or allow user "
                      "namespaces in the container")  # fmt: skip
    elif backend.name != "bubblewrap":
        production = not settings.DATABASE_IS_SQLITE
        yield Finding("sandbox", FAIL if production else WARN,
                      f"{backend.name} (AUTOPLANE_SANDBOX_INSECURE=true): code steps run without isolation, as "
                      "the worker's user, and can read its data directory and keys",
                      "AUTOPLANE_SANDBOX_BACKEND=bubblewrap (docs/sandbox.md, \"In Docker\")")  # fmt: skip
    else:
        yield Finding("sandbox", OK, "bubblewrap starts")


# --- keys and settings ------------------------------------------------------------------


def _mode_finding(name: str, path: Path) -> Finding | None:
    """A key file must be readable by its owner only."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Finding(name, WARN, f"{path} is mode {mode:04o}: others may read it", f"chmod 600 {path}")
    return None


def check_signing_key() -> Iterator[Finding]:
    if settings.AUTOPLANE_SIGNING_KEY:
        try:
            signing_key()
        except Exception as exc:
            yield Finding("signing_key", FAIL, f"AUTOPLANE_SIGNING_KEY is not usable ({_category(exc)})",
                          "set it to an Ed25519 private key (PEM), e.g. from manage.py keygen")  # fmt: skip
            return
        yield Finding("signing_key", OK, "from AUTOPLANE_SIGNING_KEY")
        return
    path = Path(settings.AUTOPLANE_SIGNING_KEY_FILE)
    if not path.exists():
        if settings.AUTOPLANE_SIGNING_KEY_AUTOGENERATE:
            yield Finding("signing_key", WARN, f"{path} does not exist yet; it is generated on first use",
                          "run: manage.py keygen (and back it up)")  # fmt: skip
        else:
            yield Finding("signing_key", FAIL, f"{path} does not exist", "run: manage.py keygen")
        return
    try:
        read_key_file(path)
    except Exception as exc:
        yield Finding("signing_key", FAIL, f"{path} is unreadable or not a key ({_category(exc)})",
                      "check its owner and mode (600), or create it: manage.py keygen --force")  # fmt: skip
        return
    yield _mode_finding("signing_key", path) or Finding("signing_key", OK, f"{path} (0600)")


def check_credential_keys() -> Iterator[Finding]:
    configured = bool(settings.AUTOPLANE_CREDENTIAL_KEYS)
    path = Path(settings.DATA_DIR) / credentials.KEY_FILE_NAME
    if not configured and not path.exists():
        # The embedded default generates it on first use; a shared database wants the keys set.
        status = OK if settings.DATABASE_IS_SQLITE else WARN
        yield Finding("credential_keys", status, f"{path} does not exist yet; it is generated on first use",
                      "set AUTOPLANE_CREDENTIAL_KEYS in production (and back the keys up)")  # fmt: skip
        return
    if not configured:
        try:
            path.read_text()
        except OSError as exc:
            yield Finding("credential_keys", FAIL, f"{path} is unreadable ({_category(exc)})",
                          "check its owner and mode (600)")  # fmt: skip
            return
    try:
        count = len(credentials.configured_keys())
        credentials.fernet()
    except Exception as exc:
        # CredentialKeyError says which key (by position), never the key itself.
        detail = str(exc) if isinstance(exc, credentials.CredentialKeyError) else _category(exc)
        yield Finding("credential_keys", FAIL, f"not usable: {detail}",
                      "AUTOPLANE_CREDENTIAL_KEYS: comma-separated Fernet keys, newest first")  # fmt: skip
        return
    source = "AUTOPLANE_CREDENTIAL_KEYS" if configured else str(path)
    finding = None if configured else _mode_finding("credential_keys", path)
    yield finding or Finding("credential_keys", OK, f"{count} key(s) from {source}")


def check_settings() -> Iterator[Finding]:
    production = not settings.DATABASE_IS_SQLITE
    if settings.DEBUG:
        yield Finding("settings.debug", FAIL if production else WARN,
                      "DEBUG is on" + (" with a production database" if production else ""),
                      "DJANGO_DEBUG=false")  # fmt: skip
    else:
        yield Finding("settings.debug", OK, "DEBUG is off")
    key = settings.SECRET_KEY
    if len(key) < 50 or len(set(key)) < 5 or key.startswith("django-insecure"):
        yield Finding("settings.secret_key", FAIL if production else WARN, "SECRET_KEY is short or a default",
                      "set DJANGO_SECRET_KEY to 50+ random characters")  # fmt: skip
    else:
        yield Finding("settings.secret_key", OK, "set")
    # The web edge's exposure (ops.checks, also in check --deploy): advice for a production database.
    for message in edge_advice() if production else ():
        yield Finding(f"settings.{message.id}", WARN, message.msg, message.hint or "")
    data_dir = Path(settings.DATA_DIR)
    if data_dir.exists() and stat.S_IMODE(data_dir.stat().st_mode) & 0o077:
        yield Finding("settings.data_dir", WARN, f"{data_dir} is readable by others", f"chmod 700 {data_dir}")
    if not settings.DEBUG:
        advice = [m for m in django_checks.run_checks(include_deployment_checks=True)
                  if m.level >= django_checks.WARNING and m.id and m.id.startswith("security.")]  # fmt: skip
        if advice:
            ids = ", ".join(sorted({m.id for m in advice if m.id}))
            yield Finding("settings.deploy", WARN, f"check --deploy: {len(advice)} warning(s) ({ids})",
                          "manage.py check --deploy explains each; fine on a laptop")  # fmt: skip
        else:
            yield Finding("settings.deploy", OK, "check --deploy: no warnings")


def check_seams() -> Iterator[Finding]:
    """The libraries whose internals the fast paths use, their installed versions and the switches."""
    line = seams.summary()
    if outside := seams.outside():
        where = "taken through the public path" if settings.AUTOPLANE_FAST_PATHS else "off anyway"
        yield Finding("seams", WARN, f"{line}; outside the bounds: {', '.join(outside)} ({where})",
                      "install the locked versions (uv sync --frozen)")  # fmt: skip
    else:
        yield Finding("seams", OK, line)


# --- peers ----------------------------------------------------------------------------------


def _tcp_reachable(url: str) -> str | None:
    """None when a TCP connection to the URL's host and port opens, else a category."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname or "", port), timeout=TIMEOUT_SECONDS):
            return None
    except OSError as exc:
        return _category(exc)


def check_mcp_servers() -> Iterator[Finding]:
    try:
        servers = list(McpServer.objects.filter(enabled=True).order_by("workspace_id", "slug")[:50])
    except Exception as exc:
        yield Finding("mcp", FAIL, f"cannot read MCP servers ({_category(exc)})", "check the database first")
        return
    if not servers:
        yield Finding("mcp", OK, "no MCP server configured")
    for server in servers:
        name = f"mcp.{server.slug}"
        if server.transport == "stdio":
            program = (server.command or [""])[0]
            if program and shutil.which(program):
                yield Finding(name, OK, f"stdio: {Path(program).name} found")
            else:
                yield Finding(name, WARN, "stdio: its program is not on this host's PATH",
                              "install it where the workers run")  # fmt: skip
            continue
        failure = _tcp_reachable(server.url)
        if failure:
            yield Finding(name, WARN, f"{_where(server.url)} unreachable ({failure})",
                          "check the server, or disable it in the admin")  # fmt: skip
        else:
            yield Finding(name, OK, f"{_where(server.url)} reachable")


def check_llm() -> Iterator[Finding]:
    if not (settings.LLM_BASE_URL and settings.LLM_MODEL):
        yield Finding("llm", OK, "not configured (drafting and agent steps are off)")
        return
    failure = _tcp_reachable(settings.LLM_BASE_URL)
    if failure:
        yield Finding("llm", WARN, f"{_where(settings.LLM_BASE_URL)} unreachable ({failure})",
                      "check LLM_BASE_URL")  # fmt: skip
    else:
        yield Finding("llm", OK, f"{settings.LLM_MODEL} at {_where(settings.LLM_BASE_URL)}")


def check_four_eyes() -> Iterator[Finding]:
    slugs = workspaces_without_four_eyes()
    if slugs:
        yield Finding("four_eyes", WARN, f"off in {len(slugs)} workspace(s) with 2+ admins/approvers: "
                      f"{', '.join(slugs[:5])}{' ...' if len(slugs) > 5 else ''}",
                      'PATCH /api/v1/workspaces/<slug> {"four_eyes": true} (docs/security.md, Four-eyes)')  # fmt: skip
    else:
        yield Finding("four_eyes", OK, "on wherever two or more people may approve")


FAST: tuple[Callable[[], Iterator[Finding]], ...] = (
    check_database, check_signing_key, check_credential_keys, check_settings, check_sandbox, check_four_eyes,
    check_seams,
)  # fmt: skip
ALL: tuple[Callable[[], Iterator[Finding]], ...] = (
    check_database, check_broker, check_workers, check_beat, check_sequencer, check_sandbox,
    check_signing_key, check_credential_keys, check_settings, check_four_eyes, check_seams, check_mcp_servers,
    check_llm,
)  # fmt: skip


def diagnose(*, fast: bool = False) -> list[Finding]:
    findings: list[Finding] = []
    for check in FAST if fast else ALL:
        try:
            findings.extend(check())
        except Exception as exc:  # a check that breaks is a finding, not a traceback
            findings.append(
                Finding(check.__name__.removeprefix("check_"), FAIL, f"check crashed ({_category(exc)})")
            )
    return findings


def as_dicts(findings: list[Finding]) -> list[dict[str, str]]:
    return [asdict(f) for f in findings]


def env_summary() -> dict[str, str]:
    """Which process and settings the report speaks for (no secrets)."""
    return {"settings": os.environ.get("DJANGO_SETTINGS_MODULE", ""), "data_dir": str(settings.DATA_DIR)}
