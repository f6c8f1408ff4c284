"""autoplane settings: one env-driven module that runs with no environment at all.

With no variables set it uses the embedded default: SQLite and a SQLite-backed
Celery broker in ``AUTOPLANE_DATA_DIR`` (default ``./var``). Point
``DATABASE_URL`` at PostgreSQL and ``CELERY_BROKER_URL`` at Redis for production.
Every variable is listed in ``.env.example``.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env")

DATA_DIR = Path(env.str("AUTOPLANE_DATA_DIR", default=str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)


def _private(path: Path, mode: int) -> None:
    """Narrow ``path`` to ``mode`` when this process owns it (the data dir holds the database and keys)."""
    try:
        if path.stat().st_uid == os.getuid() and path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except OSError:  # not ours to change, or gone meanwhile
        pass


def _private_file(path: Path) -> None:
    """Create ``path`` empty with mode 0600 if it is missing (SQLite then keeps that mode for the
    database and gives it to its -wal and -shm files), or narrow an existing one to 0600."""
    try:
        path.touch(mode=0o600, exist_ok=False)
    except FileExistsError:
        _private(path, 0o600)


_private(DATA_DIR, 0o700)


def _persistent_secret(filename: str, generate) -> str:
    """A value generated once and kept in the data directory (embedded default only)."""
    path = DATA_DIR / filename
    if not path.exists():
        path.touch(mode=0o600)
        path.write_text(generate())
    return path.read_text().strip()


DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="") or _persistent_secret(
    "django_secret_key", lambda: secrets.token_urlsafe(50)
)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# HTTPS (`manage.py check --deploy`): off by default for the embedded, plain-HTTP default;
# docker-compose.yml turns them on for production. Behind a TLS-terminating proxy, set
# DJANGO_SECURE_PROXY_SSL_HEADER so Django sees the original scheme (else redirects loop).
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # probes inside the container speak plain HTTP
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)
SESSION_COOKIE_SECURE = env.bool("DJANGO_SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("DJANGO_CSRF_COOKIE_SECURE", default=False)
if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", default=False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Reverse proxies in front of the web server that append the client's address to
# X-Forwarded-For (config/client_address.py): the client is read that many entries
# from the right. 0 (no proxy): REMOTE_ADDR, and the header is ignored.
AUTOPLANE_TRUSTED_PROXY_HOPS = env.int("AUTOPLANE_TRUSTED_PROXY_HOPS", default=0)
if not 0 <= AUTOPLANE_TRUSTED_PROXY_HOPS <= 10:
    raise ImproperlyConfigured("AUTOPLANE_TRUSTED_PROXY_HOPS must be between 0 and 10")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_json_widget",  # its static JSONEditor (code editor + JSON schema checks) for the definition field
    "django_celery_beat",
    "axes",  # admin login throttling (AXES_* below)
    "audit",
    "workspaces",
    "capabilities",
    "approvals",
    "notifications",
    "automations",
    "triggers",
    "mcpserver",
    "ops",
]

MIDDLEWARE = [
    "config.middleware.RequestMetricsMiddleware",  # outermost: times and counts every answer
    "config.middleware.JsonErrorMiddleware",  # first: it also answers for what the others refuse
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: answers a locked-out login attempt with 429
]

# Admin login throttling (django-axes): after AUTOPLANE_LOGIN_FAILURE_LIMIT failed logins for
# one username from one client address (config/client_address.py), that pair is refused, right
# password or not, for AUTOPLANE_LOGIN_COOLOFF_MINUTES; a success before the limit resets the count.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AUTOPLANE_LOGIN_FAILURE_LIMIT = env.int("AUTOPLANE_LOGIN_FAILURE_LIMIT", default=5)
AUTOPLANE_LOGIN_COOLOFF_MINUTES = env.float("AUTOPLANE_LOGIN_COOLOFF_MINUTES", default=15.0)
if AUTOPLANE_LOGIN_FAILURE_LIMIT < 1 or AUTOPLANE_LOGIN_COOLOFF_MINUTES <= 0:
    raise ImproperlyConfigured(
        "AUTOPLANE_LOGIN_FAILURE_LIMIT must be >= 1, AUTOPLANE_LOGIN_COOLOFF_MINUTES > 0"
    )
AXES_FAILURE_LIMIT = AUTOPLANE_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=AUTOPLANE_LOGIN_COOLOFF_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_CLIENT_IP_CALLABLE = "config.client_address.request_client_address"
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False  # no banner on stdout at start (it would land in `doctor --json` and the like)

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------
SQLITE_PATH = DATA_DIR / "autoplane.sqlite3"
DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{SQLITE_PATH}")}
_db = DATABASES["default"]
if _db["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, workers, beat) share the file: WAL lets readers run
    # beside the one writer, the busy timeout makes writers queue instead of
    # failing, and IMMEDIATE transactions take the write lock up front so two
    # writers never deadlock upgrading a read lock.
    _db.setdefault("OPTIONS", {}).update(
        {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": (
                "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; "
                "PRAGMA busy_timeout=30000; PRAGMA foreign_keys=ON;"
            ),
        }
    )
    _db["TEST"] = {"NAME": str(DATA_DIR / "test_autoplane.sqlite3")}
    if Path(_db["NAME"]).parent == DATA_DIR:
        _private_file(Path(_db["NAME"]))
elif _db["ENGINE"] in ("django.db.backends.postgresql",):
    # Django's backend, with a health check that needs no round trip on an idle connection.
    _db["ENGINE"] = "config.postgresql"
    _db.setdefault("CONN_MAX_AGE", env.int("DATABASE_CONN_MAX_AGE", default=60))
    _db.setdefault("CONN_HEALTH_CHECKS", True)
else:
    raise ImproperlyConfigured("DATABASE_URL must point at PostgreSQL or SQLite")
DATABASE_IS_SQLITE = _db["ENGINE"] == "django.db.backends.sqlite3"
# What sits between the processes and PostgreSQL: "" (nothing, or a pooler in session mode) or
# "transaction" (e.g. PgBouncer's pool_mode = transaction: each transaction may run on another
# server session). With "transaction", nothing may rely on session state: no server-side cursors
# and no SQL-level prepared statements (AUTOPLANE_PREPARED_STATEMENTS then defaults to off).
DATABASE_POOLER = env.str("DATABASE_POOLER", default="").lower()
if DATABASE_POOLER not in ("", "session", "transaction"):
    raise ImproperlyConfigured("DATABASE_POOLER must be empty, 'session' or 'transaction'")
# The hot path's statements PREPAREd once per PostgreSQL session and sent as EXECUTE (on); off:
# every statement is sent as its plain text, and no PREPARE is ever sent.
AUTOPLANE_PREPARED_STATEMENTS = env.bool(
    "AUTOPLANE_PREPARED_STATEMENTS", default=DATABASE_POOLER != "transaction"
)
# The fast paths that reach past a library's public API (config/seams.py: psycopg's BEGIN fold,
# the direct LPUSH of a task message, the pool-less Redis connection); off: the public path.
AUTOPLANE_FAST_PATHS = env.bool("AUTOPLANE_FAST_PATHS", default=True)
if DATABASE_POOLER == "transaction" and not DATABASE_IS_SQLITE:
    if AUTOPLANE_PREPARED_STATEMENTS:
        raise ImproperlyConfigured(
            "AUTOPLANE_PREPARED_STATEMENTS must be off with DATABASE_POOLER=transaction: a transaction"
            " pooler hands each transaction another server session, which lacks the prepared statements"
        )
    _db["DISABLE_SERVER_SIDE_CURSORS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DATA_DIR / "static"

LOGIN_URL = "/admin/login/"

# --- Celery ---------------------------------------------------------------
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=f"sqla+sqlite:///{DATA_DIR / 'broker.sqlite3'}")
BROKER_IS_EMBEDDED = CELERY_BROKER_URL.startswith(("sqla+", "filesystem://"))
# The few kept results (health pings, the benchmark's baseline) go next to the
# broker: SQLite beside the embedded broker, Redis on Redis, and RabbitMQ's RPC
# reply queues on AMQP (Celery has no 'amqp' result backend).
if BROKER_IS_EMBEDDED:
    _default_result_backend = f"db+sqlite:///{DATA_DIR / 'results.sqlite3'}"
elif CELERY_BROKER_URL.startswith(("amqp://", "amqps://", "pyamqp://")):
    _default_result_backend = "rpc://"
else:
    _default_result_backend = CELERY_BROKER_URL
CELERY_RESULT_BACKEND = env.str("CELERY_RESULT_BACKEND", default=_default_result_backend)
for _url in (CELERY_BROKER_URL, CELERY_RESULT_BACKEND):  # the embedded broker's files: private too
    if (
        _url.startswith(("sqla+sqlite:///", "db+sqlite:///"))
        and Path(_url.split(":///", 1)[1]).parent == DATA_DIR
    ):
        _private_file(Path(_url.split(":///", 1)[1]))
# Longest allowed step is 1 h (the long queue); a late-acked message must not be
# redelivered while its step is still legitimately running.
CELERY_VISIBILITY_TIMEOUT = env.int("CELERY_VISIBILITY_TIMEOUT", default=2 * 3600)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_VISIBILITY_TIMEOUT}
# Seconds between two polls of the embedded broker (a second of latency per task at kombu's default 1 s).
EMBEDDED_BROKER_POLLING_INTERVAL = env.float("CELERY_POLLING_INTERVAL", default=0.05)
# Between two polls a worker of the embedded broker looks this often whether a message was
# published to its queues (a stat of a bell file, no lock) and polls at once if one was
# (config/embedded_broker.py).
EMBEDDED_BROKER_WAKE_INTERVAL = env.float("CELERY_WAKE_INTERVAL", default=0.002)
if CELERY_BROKER_URL.startswith("sqla+"):
    # kombu's SQLAlchemy transport hands every transport option to SQLAlchemy's
    # create_engine(), which rejects the ones it does not know (kombu#2157), and
    # it has no visibility timeout anyway; its polling interval is therefore set on
    # the transport class, config.embedded_broker.Transport (not imported here: it
    # loads SQLAlchemy, ~0.5 s, and only a process that talks to the broker needs it).
    CELERY_BROKER_TRANSPORT_OPTIONS = {}
elif BROKER_IS_EMBEDDED:
    CELERY_BROKER_TRANSPORT_OPTIONS["polling_interval"] = EMBEDDED_BROKER_POLLING_INTERVAL

# Task events (task-received/started/succeeded...) for Flower and `celery events`: off by
# default, they add a broker publish per task state (docs/performance.md); docker-compose.yml
# turns them on. `celery control enable_events` also switches them on at run time.
CELERY_WORKER_SEND_TASK_EVENTS = env.bool("CELERY_WORKER_SEND_TASK_EVENTS", default=False)

# --- autoplane --------------------------------------------------------------
AUTOPLANE_SIGNING_KEY = env.str("AUTOPLANE_SIGNING_KEY", default="")
AUTOPLANE_SIGNING_KEY_FILE = Path(
    env.str("AUTOPLANE_SIGNING_KEY_FILE", default=str(DATA_DIR / "signing_key.pem"))
)
# Public keys of retired signing keys (PEM files), kept so old tokens and
# checkpoints still verify after rotation.
AUTOPLANE_RETIRED_PUBLIC_KEY_FILES = [
    Path(p) for p in env.list("AUTOPLANE_RETIRED_PUBLIC_KEY_FILES", default=[])
]
# Generate the key file on first use. Default only for the embedded (SQLite)
# setup: with PostgreSQL every process must share one key, so create it with
# `manage.py keygen` (or set AUTOPLANE_SIGNING_KEY) instead of letting each
# container invent its own.
AUTOPLANE_SIGNING_KEY_AUTOGENERATE = env.bool(
    "AUTOPLANE_SIGNING_KEY_AUTOGENERATE", default=DATABASE_IS_SQLITE
)
# Threads per web process that run Django views (ops/asgi.py); each keeps its own
# database connection. Requests are read on the event loop before they get one.
AUTOPLANE_WEB_THREADS = env.int("AUTOPLANE_WEB_THREADS", default=4)
# /metrics and /healthz (ops/access.py): with a token set, /metrics needs
# "Authorization: Bearer <token>" or a staff session; /healthz tells an anonymous caller
# its status only ("private", the default) or its whole report ("public").
AUTOPLANE_METRICS_TOKEN = env.str("AUTOPLANE_METRICS_TOKEN", default="")
AUTOPLANE_HEALTHZ_DETAILS = env.str("AUTOPLANE_HEALTHZ_DETAILS", default="private")
if AUTOPLANE_HEALTHZ_DETAILS not in ("private", "public"):
    raise ImproperlyConfigured("AUTOPLANE_HEALTHZ_DETAILS must be private or public")
# A request's whole body must arrive within this many seconds of its headers (else 408);
# it is read on the event loop, up to DATA_UPLOAD_MAX_MEMORY_SIZE (else 413), before a
# thread is taken, so a client trickling its body holds a socket, never a thread.
AUTOPLANE_BODY_READ_TIMEOUT_SECONDS = env.float("AUTOPLANE_BODY_READ_TIMEOUT_SECONDS", default=20.0)
if not 0 < AUTOPLANE_BODY_READ_TIMEOUT_SECONDS <= 600:
    raise ImproperlyConfigured("AUTOPLANE_BODY_READ_TIMEOUT_SECONDS must be above 0 and at most 600")
# The audit sequencer (docs/audit.md): appends wait at most this long before they
# are chained (reported by /healthz and /metrics); the sequencer polls every
# INTERVAL and chains at most BATCH entries of a chain per transaction.
AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS = env.float("AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS", default=1.0)
AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS = env.float(
    "AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS", default=0.5
)
if AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS >= AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS:
    raise ImproperlyConfigured(
        "AUTOPLANE_AUDIT_SEQUENCE_INTERVAL_SECONDS must be below AUTOPLANE_AUDIT_MAX_MERGE_DELAY_SECONDS"
    )
AUTOPLANE_AUDIT_SEQUENCE_BATCH = env.int("AUTOPLANE_AUDIT_SEQUENCE_BATCH", default=2000)
# The looping sequencer lowers its own CPU priority by this nice increment (0-19): its
# passes are background work, and on a busy machine they should yield the CPU to the
# web and worker processes on a run's path (a pass takes a few ms, so it still keeps the bound).
AUTOPLANE_AUDIT_SEQUENCER_NICE = env.int("AUTOPLANE_AUDIT_SEQUENCER_NICE", default=10)
if not 0 <= AUTOPLANE_AUDIT_SEQUENCER_NICE <= 19:
    raise ImproperlyConfigured("AUTOPLANE_AUDIT_SEQUENCER_NICE must be between 0 and 19")
AUTOPLANE_AUDIT_CHECKPOINT_SECONDS = env.int("AUTOPLANE_AUDIT_CHECKPOINT_SECONDS", default=300)
AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES = env.int("AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES", default=64 * 1024)
# GET /api/v1/audit/verify serves stored results (audit/verifications.py): beat verifies every
# chain incrementally this often, and a result older than this is refreshed (incrementally)
# on read. A full walk through the API is for admins, once per chain per interval.
AUTOPLANE_AUDIT_VERIFY_SECONDS = env.int("AUTOPLANE_AUDIT_VERIFY_SECONDS", default=600)
AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS = env.int(
    "AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS", default=900
)
# Audit ledger truncation (docs/audit.md, "Retention"): 0 keeps the ledger forever.
AUTOPLANE_AUDIT_RETENTION_DAYS = env.int("AUTOPLANE_AUDIT_RETENTION_DAYS", default=0)
# Where truncated prefixes are archived (audit_export's format); empty: DATA_DIR/audit-exports.
AUTOPLANE_AUDIT_EXPORT_DIR = env.str("AUTOPLANE_AUDIT_EXPORT_DIR", default="")

# History retention (docs/operations.md, "Retention"): finished runs, with their steps
# and step outputs, older than this many days are deleted by `manage.py prune_history`
# and hourly by beat, in batches of BATCH runs (one short transaction each). 0 keeps
# them forever (the default). _BY_WORKSPACE overrides it per workspace slug:
# "acme=30,audit-heavy=0". The audit ledger is never touched by this.
AUTOPLANE_RUN_RETENTION_DAYS = env.int("AUTOPLANE_RUN_RETENTION_DAYS", default=0)
AUTOPLANE_RUN_RETENTION_DAYS_BY_WORKSPACE = {
    slug: int(days)
    for slug, days in env.dict("AUTOPLANE_RUN_RETENTION_DAYS_BY_WORKSPACE", default={}).items()
}
AUTOPLANE_RUN_RETENTION_BATCH = env.int("AUTOPLANE_RUN_RETENTION_BATCH", default=500)

AUTOPLANE_CREDENTIAL_KEYS = env.list("AUTOPLANE_CREDENTIAL_KEYS", default=[])
AUTOPLANE_EGRESS_ALLOWLIST = env.list("AUTOPLANE_EGRESS_ALLOWLIST", default=[])
# Hosts and CIDRs no step may reach whatever a workspace allowlists, on top of the built-in
# deny-list (loopback, link-local and cloud metadata, the database and broker hosts); only
# an AUTOPLANE_EGRESS_ALLOWLIST entry naming a denied host or address opens it
# (docs/security.md, "Egress").
AUTOPLANE_EGRESS_DENYLIST = env.list("AUTOPLANE_EGRESS_DENYLIST", default=[])
AUTOPLANE_SANDBOX_BACKEND = env.str("AUTOPLANE_SANDBOX_BACKEND", default="bubblewrap")
# "subprocess" runs code steps as the worker's user with no isolation; every process refuses
# to start with it unless this says the deployment accepts that (development only).
AUTOPLANE_SANDBOX_INSECURE = env.bool("AUTOPLANE_SANDBOX_INSECURE", default=False)
# run_python/run_shell with "network": "allow" share the worker's network, loopback
# included; refuse it unless the deployment has isolated its workers' network.
AUTOPLANE_SANDBOX_ALLOW_NETWORK = env.bool("AUTOPLANE_SANDBOX_ALLOW_NETWORK", default=False)
AUTOPLANE_BWRAP_PATH = env.str("AUTOPLANE_BWRAP_PATH", default="bwrap")
if AUTOPLANE_SANDBOX_BACKEND not in ("bubblewrap", "subprocess"):
    raise ImproperlyConfigured("AUTOPLANE_SANDBOX_BACKEND must be 'bubblewrap' or 'subprocess'")
if AUTOPLANE_SANDBOX_BACKEND == "subprocess" and not AUTOPLANE_SANDBOX_INSECURE:
    # Every process (web, workers, beat, manage.py) stops here with this one line on stderr.
    raise SystemExit(
        "autoplane: AUTOPLANE_SANDBOX_BACKEND=subprocess runs code steps unisolated, as the worker's user "
        "(its environment, data dir and keys readable); use bubblewrap (docs/sandbox.md) or set "
        "AUTOPLANE_SANDBOX_INSECURE=true (development only)"
    )

# Failed webhook authentication (docs/security.md, "Failed webhook authentication"): counted
# per fixed window; past the limit a client address gets 429 without its token being
# checked, and an automation's failed attempts get 429 (a valid token still fires).
# The ledger records the first AUDITED rejections of an automation per window one by one,
# the rest as one summary row with a count.
AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS = env.int("AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS", default=60)
AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_ADDRESS = env.int(
    "AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_ADDRESS", default=30
)
AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_AUTOMATION = env.int(
    "AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_AUTOMATION", default=300
)
AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED = env.int("AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED", default=10)
if AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS < 1:
    raise ImproperlyConfigured("AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS must be at least 1")

# Recovery intervals: what each trades off is in docs/operations.md, "Recovery intervals".
# A running step renews its run's lease every third of it; a run whose worker stopped
# renewing for this long is recovered by the sweep (on another host; on the same host
# a dead worker's run is taken over at once).
AUTOPLANE_RUN_LEASE_SECONDS = env.int("AUTOPLANE_RUN_LEASE_SECONDS", default=30)
AUTOPLANE_SWEEP_SECONDS = env.int("AUTOPLANE_SWEEP_SECONDS", default=5)
# A queued run whose message has not been taken this long is sent again by the sweep
# even though its queue holds messages (the relay handles queues holding none). Too
# short re-sends messages merely waiting behind a busy queue (harmless: execution
# starts with a claim, but it grows the backlog).
AUTOPLANE_REQUEUE_AFTER_SECONDS = env.int("AUTOPLANE_REQUEUE_AFTER_SECONDS", default=60)
# First delay of a retried step; linear backoff multiplies it by the attempt, exponential
# doubles it per attempt (capped at 300 s, with ±20 % jitter).
AUTOPLANE_RETRY_BASE_SECONDS = env.float("AUTOPLANE_RETRY_BASE_SECONDS", default=2.0)
# A run whose worker died mid-step is taken over by another ("recovered"); a run
# recovered this many times fails with RECOVERY_LIMIT when its worker dies again
# (a poison run: a step that kills its worker every time must not loop forever).
AUTOPLANE_MAX_RECOVERIES = env.int("AUTOPLANE_MAX_RECOVERIES", default=3)
# A worker that meets a database error (restart, killed connection) reconnects and
# goes on, retrying every 2 s at most for this long; then the run is the sweep's.
AUTOPLANE_DB_RETRY_SECONDS = env.float("AUTOPLANE_DB_RETRY_SECONDS", default=120.0)
# A schedule slot found this late (beat was down) still fires; older slots follow catch_up.
AUTOPLANE_SCHEDULE_MISFIRE_GRACE_SECONDS = env.int("AUTOPLANE_SCHEDULE_MISFIRE_GRACE_SECONDS", default=300)
for _name in (
    "AUTOPLANE_MAX_RECOVERIES",
    "AUTOPLANE_DB_RETRY_SECONDS",
    "AUTOPLANE_REQUEUE_AFTER_SECONDS",
    "AUTOPLANE_RETRY_BASE_SECONDS",
    "AUTOPLANE_SCHEDULE_MISFIRE_GRACE_SECONDS",
):
    if globals()[_name] < 0:
        raise ImproperlyConfigured(f"{_name} must not be negative")
# The relay (beat, every RELAY_SECONDS) sends again what was committed but never
# reached the broker, or was lost in it: queued runs whose queue holds no message,
# and events undelivered, RELAY_AFTER_SECONDS after they were sent. See
# docs/operations.md, "Recovery intervals".
AUTOPLANE_RELAY_SECONDS = env.float("AUTOPLANE_RELAY_SECONDS", default=2.0)
# Where webhook rate-limit windows are counted: Redis (one INCR, no database commit per
# fire) when the broker is Redis, else the database. A Redis that does not answer falls
# back to the database for that fire.
AUTOPLANE_RATE_LIMIT_REDIS_URL = env.str(
    "AUTOPLANE_RATE_LIMIT_REDIS_URL",
    default=CELERY_BROKER_URL if CELERY_BROKER_URL.startswith(("redis://", "rediss://")) else "",
)
AUTOPLANE_RELAY_AFTER_SECONDS = env.float("AUTOPLANE_RELAY_AFTER_SECONDS", default=5.0)

# Set by `manage.py up` for its children: the supervisor's state file, read by
# /healthz and /metrics (restarts, crash-looping children). Empty: not under `up`.
AUTOPLANE_SUPERVISOR_STATE_FILE = env.str("AUTOPLANE_SUPERVISOR_STATE_FILE", default="")

# The platform's own MCP server (manage.py mcp_serve, docs/mcp.md): the API token the
# stdio transport acts as, and where `mcp_serve --http` listens by default.
AUTOPLANE_API_TOKEN = env.str("AUTOPLANE_API_TOKEN", default="")
AUTOPLANE_MCP_HOST = env.str("AUTOPLANE_MCP_HOST", default="127.0.0.1")
AUTOPLANE_MCP_PORT = env.int("AUTOPLANE_MCP_PORT", default=8765)

# --- LLM (drafting automations, agent_task; docs/llm.md) ---------------------------
# An OpenAI-compatible chat-completions server. Unset base URL or model: every LLM
# feature answers 503 LLM_NOT_CONFIGURED and everything else works.
LLM_BASE_URL = env.str("LLM_BASE_URL", default="")
LLM_MODEL = env.str("LLM_MODEL", default="")
LLM_API_KEY = env.str("LLM_API_KEY", default="")
LLM_TIMEOUT_SECONDS = env.float("LLM_TIMEOUT_SECONDS", default=60.0)
LLM_MAX_RETRIES = env.int("LLM_MAX_RETRIES", default=2)
LLM_RETRY_BASE_SECONDS = env.float("LLM_RETRY_BASE_SECONDS", default=0.5)
LLM_MAX_RESPONSE_BYTES = env.int("LLM_MAX_RESPONSE_BYTES", default=256 * 1024)
LLM_DRAFT_TTL_SECONDS = env.int("LLM_DRAFT_TTL_SECONDS", default=24 * 3600)
if LLM_TIMEOUT_SECONDS <= 0 or LLM_MAX_RETRIES < 0 or LLM_RETRY_BASE_SECONDS < 0:
    raise ImproperlyConfigured(
        "LLM_TIMEOUT_SECONDS must be > 0, LLM_MAX_RETRIES and LLM_RETRY_BASE_SECONDS >= 0"
    )
if LLM_MAX_RESPONSE_BYTES < 1024 or LLM_DRAFT_TTL_SECONDS < 60:
    raise ImproperlyConfigured("LLM_MAX_RESPONSE_BYTES must be >= 1024 and LLM_DRAFT_TTL_SECONDS >= 60")


def _llm_prices(entries: list[str]) -> dict[str, tuple[Decimal, Decimal]]:
    """``MODEL=INPUT:OUTPUT`` entries, USD per million tokens; ``*`` prices any other model."""
    prices = {}
    for entry in entries:
        model, _, pair = entry.strip().rpartition("=")
        try:
            price = tuple(Decimal(part) for part in pair.split(":"))
        except ArithmeticError:
            price = ()
        if not model or len(price) != 2 or not all(p.is_finite() and p >= 0 for p in price):
            raise ImproperlyConfigured(
                f"LLM_PRICES entry {entry!r} is not MODEL=INPUT:OUTPUT (USD per 1M tokens)"
            )
        prices[model.strip()] = price
    return prices


LLM_PRICES = _llm_prices(env.list("LLM_PRICES", default=[]))

EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="django.core.mail.backends.console.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="autoplane@localhost")
# Senders a send_email step may set as "from" (comma-separated addresses, or "@example.com"
# for a whole domain); DEFAULT_FROM_EMAIL is always allowed. Any other "from" is refused.
AUTOPLANE_EMAIL_ALLOWED_FROM = env.list("AUTOPLANE_EMAIL_ALLOWED_FROM", default=[])
EMAIL_HOST = env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = env.int("EMAIL_PORT", default=25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = env.bool("EMAIL_USE_SSL", default=False)
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("EMAIL_USE_TLS (STARTTLS) and EMAIL_USE_SSL (implicit TLS) exclude each other")
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", default=10)

# --- Notifications (approval notices: notifications/) ------------------------
# The address people reach the platform at: the links in notices are built on it.
AUTOPLANE_PUBLIC_URL = env.str("AUTOPLANE_PUBLIC_URL", default="http://localhost:8000")
# Each try of a Slack or webhook delivery gives up after this many seconds (then retried).
AUTOPLANE_NOTIFY_TIMEOUT_SECONDS = env.float("AUTOPLANE_NOTIFY_TIMEOUT_SECONDS", default=5.0)
# The first retry's delay in seconds; each next one doubles (at most 5 attempts).
AUTOPLANE_NOTIFY_RETRY_SECONDS = env.float("AUTOPLANE_NOTIFY_RETRY_SECONDS", default=10.0)
# How often beat looks for reminders and escalations that are due.
AUTOPLANE_NOTIFY_SWEEP_SECONDS = env.float("AUTOPLANE_NOTIFY_SWEEP_SECONDS", default=15.0)

# --- REST API --------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "workspaces.authentication.ApiTokenAuthentication",  # hashed tokens (workspaces.api_tokens)
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "workspaces.authentication.TokenScopeAllows",  # an mcp token: reads, runs and drafts only
    ],
    "DEFAULT_PAGINATION_CLASS": "config.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "config.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api_errors.exception_handler",
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    # JSON only (strict: config.strict_json); any other media type is a 415.
    "DEFAULT_PARSER_CLASSES": ["config.parsers.StrictJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "autoplane API",
    "DESCRIPTION": "Automations, runs, approvals, triggers and the audit ledger.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Request and response shapes as separate components: a field the server fills is not
    # asked of the client, and a non-blank string in a request says so (minLength 1).
    "COMPONENT_SPLIT_REQUEST": True,
    "ENUM_NAME_OVERRIDES": {
        "AutomationStatusEnum": "automations.models.AutomationStatus",
        "RunStatusEnum": "automations.models.RunStatus",
        "StepStatusEnum": "automations.models.StepStatus",
        "ApprovalStatusEnum": "approvals.models.ApprovalStatus",
        "McpToolStatusEnum": "capabilities.models.McpToolStatus",
    },
    # /api/docs/ from pinned, locally served assets (drf-spectacular-sidecar): no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": "none"},
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "webhookToken": {
                "type": "http",
                "scheme": "bearer",
                "description": "The trigger's webhook token (POST /triggers/{id}/rotate-token).",
            }
        }
    },
}

# LOG_FORMAT=json: one JSON object per line with run_id, trace_id, workspace and step_id where
# they apply (config/logs.py); text (the default) for a terminal.
LOG_FORMAT = env.str("LOG_FORMAT", default="text").lower()
if LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured("LOG_FORMAT must be 'text' or 'json'")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "config.logs.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "json" if LOG_FORMAT == "json" else "plain",
        }
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # A 4xx is the client's business, not a warning of ours; 5xx stay ERROR.
        "django.request": {"level": "ERROR"},
        # Housekeeping chatter (beat sending due tasks, every task received and succeeded):
        # shown only with LOG_LEVEL=DEBUG. Failures are logged at ERROR whatever the level.
        **{
            name: {"level": "DEBUG" if env.str("LOG_LEVEL", default="INFO").upper() == "DEBUG" else "WARNING"}
            for name in ("celery.beat", "celery.worker.strategy", "celery.app.trace")
        },
    },
}

# Housekeeping on Celery Beat (synced into django-celery-beat's tables by the
# DatabaseScheduler). Each task is implemented by the app named in its name.
CELERY_BEAT_SCHEDULE = {
    "beat-heartbeat": {"task": "autoplane.beat_heartbeat", "schedule": 10.0},
    "audit-checkpoint": {
        "task": "autoplane.audit_checkpoint",
        "schedule": float(AUTOPLANE_AUDIT_CHECKPOINT_SECONDS),
    },
    "sweep-runs": {"task": "autoplane.sweep_runs", "schedule": float(AUTOPLANE_SWEEP_SECONDS)},
    "relay": {"task": "autoplane.relay", "schedule": AUTOPLANE_RELAY_SECONDS},
    "expire-approvals": {"task": "autoplane.expire_approvals", "schedule": 30.0},
    "notify-sweep": {"task": "autoplane.notify_sweep", "schedule": AUTOPLANE_NOTIFY_SWEEP_SECONDS},
    "purge-expired": {"task": "autoplane.purge_expired", "schedule": 3600.0},
    "prune-history": {"task": "autoplane.prune_history", "schedule": 3600.0},
    "audit-truncate": {"task": "autoplane.audit_truncate", "schedule": 3600.0},
    "audit-verify": {"task": "autoplane.audit_verify", "schedule": float(AUTOPLANE_AUDIT_VERIFY_SECONDS)},
    "webhook-rejections": {
        "task": "autoplane.webhook_rejections_summarize",
        "schedule": float(AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS),
    },
    "harvest-mcp-servers": {"task": "autoplane.harvest_mcp_servers", "schedule": 86400.0},
}
