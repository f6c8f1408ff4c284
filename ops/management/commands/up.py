"""``manage.py up``: the whole platform on one machine, stopped cleanly with Ctrl-C.

Migrates, bootstraps an empty installation (admin user, ``default`` workspace,
API token, signing key, example automations), then supervises the web server,
one Celery worker per queue, exactly one beat and the audit sequencer (see ``ops/supervisor.py``
for the restart and shutdown policy).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import psycopg.sql
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

from config.celery import QUEUES
from config.logs import json_line
from ops.doctor import diagnose
from ops.services import Bootstrap, platform_bootstrap
from ops.supervisor import ChildSpec, Supervisor
from triggers.models import Trigger

EXAMPLE_NAME, EXAMPLE_TRIGGER = "Hello autoplane", "hook"  # examples/hello.json
# Celery warns, in 8 lines per worker, when it runs as root; up says it once instead.
ROOT_WARNING_FILTER = "ignore:You're running the worker with superuser privileges"
DEFAULT_CONCURRENCY = {"default": 1, "automations_fast": 2, "automations_medium": 1, "automations_long": 1}
READY_TIMEOUT = 120.0


def parse_concurrency(text: str) -> dict[str, int]:
    """``"2"`` (every queue) or ``"fast=2,medium=1,long=1,default=1"`` (short or full queue names)."""
    result = dict(DEFAULT_CONCURRENCY)
    text = text.strip()
    try:
        if text.isdigit():
            result = dict.fromkeys(QUEUES, int(text))
        else:
            for item in filter(None, (part.strip() for part in text.split(","))):
                name, _, value = item.partition("=")
                queue = name.strip() if name.strip() in QUEUES else f"automations_{name.strip()}"
                if queue not in QUEUES:
                    raise CommandError(
                        f"--concurrency: unknown queue {name.strip()!r} (queues: {', '.join(QUEUES)})"
                    )
                result[queue] = int(value)
    except ValueError:
        raise CommandError(f"--concurrency: {text!r} is not N or queue=N,... with whole numbers")
    if any(n < 1 for n in result.values()):
        raise CommandError("--concurrency: every queue needs at least 1 process")
    return result


def default_web_workers() -> int:
    return min(4, max(2, os.cpu_count() or 2))


def _short(queue: str) -> str:
    return queue.removeprefix("automations_")


def state_file_for(port: int) -> Path:
    """Where the supervisor of an ``up`` on ``port`` keeps its children's state (read by /healthz)."""
    return Path(settings.DATA_DIR) / f"up-{port}.state.json"


def metrics_dir_for(port: int) -> Path:
    """Where the processes of an ``up`` on ``port`` keep their Prometheus counters (multiprocess mode)."""
    return Path(settings.DATA_DIR) / f"metrics-{port}"


def empty_metrics_dir(path: Path) -> Path:
    """Remove the counters' files of earlier processes (Prometheus sees a counter reset)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink(missing_ok=True)
    return path


def fresh_metrics_dir(port: int) -> Path:
    """An empty metrics directory: counters start at zero with each ``up``."""
    return empty_metrics_dir(metrics_dir_for(port))


def worker_flags(*, embedded: bool) -> list[str]:
    """Gossip and mingle need broker broadcast and only slow the start (/healthz uses ops heartbeats).

    Celery gives a worker an event dispatcher only when task events are on, or gossip
    or the event heartbeat is: on Redis and RabbitMQ the heartbeat stays (one small
    message every 2 s), so ``celery control enable_events`` and Flower work without a
    restart. The embedded broker cannot broadcast, so it has nothing to gain.
    """
    flags = ["--without-gossip", "--without-mingle"]
    return [*flags, "--without-heartbeat"] if embedded else flags


def build_specs(*, host: str, port: int, concurrency: dict[str, int], web_workers: int) -> list[ChildSpec]:
    python = sys.executable
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "AUTOPLANE_SUPERVISOR_STATE_FILE": str(state_file_for(port)),
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir_for(port)),
        # up ran Django's system checks before starting them; a Celery worker would run
        # them again (and import the URLconf, the API and the admin only the web needs).
        "CELERY_SKIP_CHECKS": "1",
    }
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env["PYTHONWARNINGS"] = ",".join(
            filter(None, [os.environ.get("PYTHONWARNINGS"), ROOT_WARNING_FILTER])
        )
    cwd = str(settings.BASE_DIR)
    bind = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if importlib.util.find_spec("gunicorn"):
        # gunicorn's asyncio worker parses requests on its event loop, so a slow or
        # stalled client holds a socket, never a worker (docs/operations.md).
        web = [python, "-m", "gunicorn", "ops.asgi:application", "--worker-class", "asgi", "--bind", bind,
               "--workers", str(web_workers), "--timeout", "60", "--graceful-timeout", "5", "--preload",
               "--no-control-socket"]  # fmt: skip
    else:
        web = [python, "manage.py", "runserver", "--noreload", bind]
    specs = [ChildSpec("web", web, env, cwd)]
    for queue in QUEUES:
        worker = [
            python, "-m", "celery", "--quiet", "-A", "config", "worker", "-Q", queue, "-n", f"{queue}@%h",
            "-c", str(concurrency[queue]), "-P", "prefork", "-O", "fair", "-l", "INFO",
            *worker_flags(embedded=settings.BROKER_IS_EMBEDDED),
        ]  # fmt: skip
        specs.append(ChildSpec(f"worker-{_short(queue)}", worker, env, cwd))
    beat = [python, "-m", "celery", "--quiet", "-A", "config", "beat", "-S", "django_celery_beat.schedulers:DatabaseScheduler",
            "-l", "INFO"]  # fmt: skip
    specs.append(ChildSpec("beat", beat, env, cwd))
    specs.append(ChildSpec("sequencer", [python, "manage.py", "audit_sequencer", "--skip-checks"], env, cwd))
    return specs


def _load_examples(*, bootstrap: Bootstrap, say) -> None:
    """Load ``examples/*.json`` into the default workspace, once, on a fresh installation.

    The engine owns the definition format and its validation; an example it
    refuses is reported and skipped, never fatal to ``up``.
    """
    try:
        from automations.services import automation_create
    except ImportError as exc:
        say(f"examples not loaded: the engine's automation_create is not available ({exc})")
        return
    from django.contrib.auth import get_user_model

    from workspaces.models import Workspace

    workspace = Workspace.objects.get(slug=bootstrap.workspace)
    user = get_user_model().objects.get(username=bootstrap.username)
    paths = sorted((Path(settings.BASE_DIR) / "examples").glob("*.json"))
    if not paths:
        say("examples not loaded: no examples/*.json")
    for path in paths:
        try:
            automation = automation_create(
                workspace=workspace, definition=json.loads(path.read_text()), user=user
            )
        except Exception as exc:
            say(f"example {path.name} not loaded: {exc}")
        else:
            say(f"example {path.name} loaded as automation {automation.pk} ({automation.name})")


def _try_it_lines(base: str, bootstrap: Bootstrap | None) -> str:
    """The README's "what next", with this installation's ids: rotate the example's webhook
    token, fire it, and where to watch the run."""
    trigger = (
        Trigger.objects.filter(automation__name=EXAMPLE_NAME, key=EXAMPLE_TRIGGER)
        .order_by("created_at")
        .first()
    )
    if trigger is None:
        return ""
    api_token = bootstrap.api_token if bootstrap is not None else "$AUTOPLANE_API_TOKEN"
    rotate = (
        f'curl -s -X POST -H "Authorization: Token {api_token}" {base}/api/v1/triggers/{trigger.pk}/rotate-token'
        " | python3 -c 'import json,sys; print(json.load(sys.stdin)[\"token\"])'"
    )
    fire = (
        f'curl -s -X POST -H "Authorization: Bearer $HOOK" -H "Content-Type: application/json" '
        f"-d {shlex.quote(json.dumps({'name': 'ada'}))} {base}/api/v1/automations/{trigger.automation_id}/fire"
    )
    return "\n".join([
        "  try it     fire the example over its webhook (a new token each time), then watch the run:",
        f"    HOOK=$({rotate}) && {fire}",
        f"             the answer's status_url ({base}/api/v1/runs/<run_id>) or {base}/admin/automations/run/",
        "",
    ])  # fmt: skip


def unapplied_migrations() -> list:
    """What ``migrate`` would apply: nothing on most starts, which then skip it (and its
    post-migrate handlers, which only matter when a migration created a model)."""
    executor = MigrationExecutor(connections["default"])
    return executor.migration_plan(executor.loader.graph.leaf_nodes())


def ensure_database(say: Callable[[str], object]) -> None:
    """A PostgreSQL database that does not exist yet is created, or one line says how to."""
    connection = connections["default"]
    try:
        connection.ensure_connection()
        return
    except OperationalError as exc:
        if settings.DATABASE_IS_SQLITE or "does not exist" not in str(exc):
            raise CommandError(f"cannot connect to the database: {str(exc).strip().splitlines()[0]}")
    params = connection.settings_dict
    name, host = params["NAME"], params.get("HOST") or "localhost"
    try:
        with psycopg.connect(
            host=host, port=params.get("PORT") or 5432, user=params.get("USER") or None,
            password=params.get("PASSWORD") or None, dbname="postgres", autocommit=True,
        ) as admin:  # fmt: skip
            admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    except psycopg.Error as exc:
        user = f" -U {params['USER']}" if params.get("USER") else ""
        raise CommandError(
            f"database {name!r} does not exist on {host} and could not be created "
            f"({str(exc).strip().splitlines()[0]}); run: createdb -h {host}{user} {name}"
        )
    say(f"database {name!r} created on {host}")


def prepare_database(say: Callable[[str], object]) -> None:
    """The configured database, created if missing (PostgreSQL) and migrated: what ``up`` and
    ``bench`` (which starts the same processes) do first."""
    ensure_database(say)
    if unapplied_migrations():
        say("applying migrations")
        call_command("migrate", interactive=False, verbosity=0)


def ensure_signing_key(say: Callable[[str], object], warn: Callable[[str], object]) -> None:
    """The signing key file, generated if there is neither a key nor a file (``warn``: it cannot be)."""
    if settings.AUTOPLANE_SIGNING_KEY:
        return
    path = Path(settings.AUTOPLANE_SIGNING_KEY_FILE)
    if path.exists():
        return
    try:
        from audit.signing import generate_key_file
    except ImportError as exc:
        warn(
            f"ERROR: cannot create the signing key {path}: audit.signing is missing ({exc}). "
            "Approvals and audit checkpoints will not be signed."
        )
        return
    try:
        generate_key_file(path)
    except FileExistsError:
        return  # another process made it first
    say(f"signing key created: {path}")


def _port_free(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class Command(BaseCommand):
    help = "Start autoplane on this machine: migrations, web, one Celery worker per queue, beat. Ctrl-C stops it."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--concurrency", default="fast=2,medium=1,long=1,default=1",
            help="Worker processes per queue: N for every queue, or fast=2,medium=1,long=1,default=1.",
        )  # fmt: skip
        parser.add_argument("--web-workers", type=int, default=default_web_workers())
        parser.add_argument("--stop-timeout", type=float, default=10.0, help="Seconds of grace on Ctrl-C.")
        parser.add_argument(
            "--init-only", action="store_true",
            help="Migrate and bootstrap (admin user, default workspace, signing key, examples), then exit "
                 "without starting anything: the one-shot step of docker-compose.",
        )  # fmt: skip

    def _write_banner(self, banner: str) -> None:
        if settings.LOG_FORMAT == "json":
            for line in filter(str.strip, banner.splitlines()):
                self.say(line.strip())
        else:
            self.stdout.write(banner)

    def say(self, message: str) -> None:
        if settings.LOG_FORMAT == "json":
            self.stdout.write(json_line("up", message))
        else:
            self.stdout.write(f"{'up':<14} | {message}")  # as wide as the supervisor's "worker-default"

    def handle(self, *args, host, port, concurrency, web_workers, stop_timeout, init_only, **options):
        started = time.monotonic()
        per_queue = parse_concurrency(concurrency)
        if not init_only and not _port_free(host, port):
            raise CommandError(f"{host}:{port} is in use; pick another with --port")

        prepare_database(self.say)
        bootstrap = platform_bootstrap()
        ensure_signing_key(self.say, self.stderr.write)
        if bootstrap is not None:
            _load_examples(bootstrap=bootstrap, say=self.say)
        base = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"  # noqa: S104
        try_it = _try_it_lines(base, bootstrap)
        connections.close_all()  # the children open their own
        self.say(f"migrations and bootstrap done ({time.monotonic() - started:.1f} s)")
        self._prerequisites()
        if init_only:
            if os.environ.get(
                "PROMETHEUS_MULTIPROC_DIR"
            ):  # docker-compose: counters start over with a deploy
                empty_metrics_dir(Path(os.environ["PROMETHEUS_MULTIPROC_DIR"]))
            self._write_banner(self._banner(base, bootstrap, urls=False))
            return
        banner = self._banner(base, bootstrap) + try_it
        self._write_banner(banner)
        fresh_metrics_dir(port)
        supervisor = Supervisor(
            build_specs(host=host, port=port, concurrency=per_queue, web_workers=web_workers),
            stop_timeout=stop_timeout,
            state_file=state_file_for(port),
            json_lines=settings.LOG_FORMAT == "json",
        )
        threading.Thread(
            target=self._announce_ready, args=(supervisor, base, started, banner), daemon=True
        ).start()
        code = supervisor.run()
        if code:
            raise SystemExit(code)

    def _prerequisites(self) -> None:
        """One line for each thing missing or unusual on this machine; nothing when all is well."""
        for finding in diagnose(fast=True):
            # The sandbox has its own line below; check --deploy advice is for `manage.py doctor`.
            if finding.status != "ok" and finding.check not in ("sandbox", "settings.deploy"):
                self.say(f"doctor: {finding.status} {finding.check}: {finding.message} ({finding.fix})")
        if settings.AUTOPLANE_SANDBOX_BACKEND == "bubblewrap" and not shutil.which(
            settings.AUTOPLANE_BWRAP_PATH
        ):
            self.say(
                f"bubblewrap ({settings.AUTOPLANE_BWRAP_PATH}) not found: code steps (run_python, run_shell) "
                "will fail closed; install it (Debian/Ubuntu: apt-get install bubblewrap)"
            )
        if settings.AUTOPLANE_SANDBOX_BACKEND == "subprocess":
            self.say("AUTOPLANE_SANDBOX_INSECURE=true: code steps run unisolated, as this user, and can read "
                     "its environment, data directory and keys; development only")  # fmt: skip
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            self.say("running as root: fine on a dev box; in production run workers as an unprivileged user")

    def _banner(self, base: str, bootstrap: Bootstrap | None, *, urls: bool = True) -> str:
        db = settings.DATABASES["default"]
        database = (
            db["NAME"] if settings.DATABASE_IS_SQLITE else f"{db.get('HOST') or 'localhost'}/{db['NAME']}"
        )
        broker = settings.CELERY_BROKER_URL.split("@")[-1]  # never print a broker password
        lines = [""]
        if urls:
            lines += [
                f"  admin      {base}/admin/",
                f"  API        {base}/api/v1/   (docs {base}/api/docs/)",
                f"  health     {base}/healthz   metrics {base}/metrics",
            ]
        lines += [f"  database   {database}", f"  broker     {broker}"]
        if bootstrap is not None:
            lines += [
                f"  login      {bootstrap.username} / {bootstrap.password}   (created now, shown once)",
                f"  API token  {bootstrap.api_token}   (workspace '{bootstrap.workspace}', role admin, shown once)",
            ]
        return "\n".join([*lines, "  Ctrl-C stops everything." if urls else "", ""])

    def _announce_ready(self, supervisor: Supervisor, base: str, started: float, banner: str) -> None:
        deadline = started + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as response:  # noqa: S310
                    if response.status == 200:
                        supervisor.say(
                            "up", f"autoplane is healthy ({time.monotonic() - started:.1f} s after start)"
                        )
                        for line in banner.splitlines():
                            supervisor.say("up", line)
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        supervisor.say("up", f"not healthy after {READY_TIMEOUT:.0f} s: see {base}/healthz")
