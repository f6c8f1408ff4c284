from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from rest_framework.test import APIClient

from bench import cancel_bench, engine_bench, history_bench, hotpath_profile, http_bench
from bench.workers import Workers
from config.celery import QUEUES
from ops.management.commands.up import default_web_workers, ensure_signing_key, prepare_database


class Command(BaseCommand):
    help = "Benchmark the engine against a bare Celery round trip on the configured database and broker."

    def add_arguments(self, parser):
        parser.add_argument("-n", type=int, default=None, help="samples per latency figure (default 200; "
                            "with --http 1000, 200 on the embedded lane: a p99 is the 10th slowest, or the 2nd)")  # fmt: skip
        parser.add_argument("--runs", type=int, default=None, help="runs for the throughput figure (default 800; "
                            "with --http on the embedded lane 200)")  # fmt: skip
        parser.add_argument("--fast-concurrency", type=int, default=2)
        parser.add_argument("--skip", nargs="*", default=[], help="sections to skip: throughput slope isolation "
                            "webhook events audit sandbox (with --http: throughput slope workspaces audit)")  # fmt: skip
        parser.add_argument("--http", action="store_true", help="start the up topology (same web server, workers, "
                            "beat) and measure what a client sees over HTTP (issue 11's table)")  # fmt: skip
        parser.add_argument("--web-workers", type=int, default=default_web_workers(), help="with --http")
        parser.add_argument("--see", choices=["db", "api"], default="db",
                            help="with --http: how the client sees a run final: poll the database, or GET the run")  # fmt: skip
        parser.add_argument("--trace", action="store_true", help="with --http: stamp each stage of n more fires "
                            "(web, broker, worker, client) and print the p50 of each segment (bench/trace.py)")  # fmt: skip
        parser.add_argument("--poll-ms", type=float, default=1.0, help="with --http: poll interval")
        parser.add_argument("--history", type=int, nargs="+", metavar="RUNS", help="seed run history up to each "
                            "size in turn (e.g. 10000 100000) and time every list over it (issue 19); test "
                            "databases only")  # fmt: skip
        parser.add_argument("--cancel", type=int, metavar="N", help="start workers and time N live cancels of a "
                            "run_python step sleeping in its sandbox (p50/max; bench/cancel_bench.py)")  # fmt: skip
        parser.add_argument("--yes-this-is-a-test-database", action="store_true", dest="confirmed")
        parser.add_argument("--profile", action="store_true", help="in-process, no workers: SQL statements and "
                            "CPU per webhook fire and per one-step run execution")  # fmt: skip
        parser.add_argument("--profile-top", type=int, default=0, help="with --profile: print the top N cProfile "
                            "functions by cumulative time")  # fmt: skip

    def handle(self, *args, n, runs, fast_concurrency, skip, **options):
        import logging

        from django.conf import settings

        small = options["http"] and settings.BROKER_IS_EMBEDDED  # a few minutes on either lane
        n = n if n is not None else 200 if small else 1000 if options["http"] else 200
        runs = runs if runs is not None else 200 if small else 800
        logging.getLogger().setLevel(logging.WARNING)  # per-step INFO lines would drown the figures
        if options["history"]:  # refused before anything (migrations included) touches the database
            try:
                history_bench.check_database(options["confirmed"])
            except history_bench.NotATestDatabase as exc:
                raise CommandError(str(exc)) from None
        # As `up` does: a fresh database is created (PostgreSQL) and migrated, a missing key made.
        prepare_database(lambda line: self.stdout.write(f"bench: {line}"))
        ensure_signing_key(lambda line: self.stdout.write(f"bench: {line}"), self.stderr.write)
        if options["history"]:
            self._history(options["history"])
            return
        if options["cancel"]:
            with Workers({queue: 1 for queue in QUEUES}) as workers:
                workers.wait_ready()
                figures = cancel_bench.run(options["cancel"], out=self.stdout.write)
            self.stdout.write("\nsummary: " + ", ".join(f"{k}={v:.3g}" for k, v in figures.items()))
            return
        if options["profile"]:
            figures = hotpath_profile.run(n=n, top=options["profile_top"], out=self.stdout.write)
            self.stdout.write("\nsummary: " + ", ".join(f"{k}={v:.3g}" for k, v in figures.items()))
            return
        if options["http"]:
            self.stdout.write(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[1]}, "
                              f"broker: {settings.CELERY_BROKER_URL.split(':', 1)[0]}")  # fmt: skip
            concurrency = {queue: 1 for queue in QUEUES} | {"automations_fast": fast_concurrency}
            table = http_bench.run(n=n, runs=runs, web_workers=options["web_workers"], concurrency=concurrency,
                                   see=options["see"], poll_ms=options["poll_ms"], skip=skip,
                                   out=self.stdout.write, traced=options["trace"])  # fmt: skip
            self.stdout.write("\n" + table.markdown())
            return

        from workspaces.models import ApiToken
        from workspaces.services import api_token_create, workspace_get_or_create

        workspace = workspace_get_or_create(slug="bench")
        # rotated, not piled up
        earlier = ApiToken.objects.filter(user__username="bench", name="bench").exists()
        token = api_token_create(username="bench", workspace_slug="bench", role="admin", actor="bench",
                                 name="bench", replace="bench" if earlier else None)  # fmt: skip

        def client_factory() -> APIClient:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
            return client

        self.stdout.write(f"database: {settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[1]}, "
                          f"broker: {settings.CELERY_BROKER_URL.split(':', 1)[0]}")  # fmt: skip
        report = engine_bench.Report()
        concurrency = {queue: 1 for queue in QUEUES} | {"automations_fast": fast_concurrency}
        with Workers(concurrency) as workers:
            workers.wait_ready()
            engine_bench.celery_baseline(report, n)
            one = engine_bench._automation(workspace, "bench 1 step", 1)
            engine_bench.manual_runs(report, client_factory, one, n)
            if "throughput" not in skip:
                engine_bench.throughput(report, client_factory, one, runs)
            if "slope" not in skip:
                plans = {k: engine_bench._automation(workspace, f"bench {k} steps", k) for k in (1, 10, 40)}
                engine_bench.step_slope(report, client_factory, plans, max(20, n // 5))
            if "isolation" not in skip:
                engine_bench.queue_isolation(report, client_factory, one, max(20, n // 5))
            if "webhook" not in skip:
                engine_bench.webhook(report, runs)
            if "events" not in skip:
                engine_bench.event_matching(report)
            if "sandbox" not in skip:
                from bench import sandbox_bench

                sandbox_bench.bench_sandbox_overhead(50, report=report)
                sandbox_bench.bench_fast_queue_sandboxed(max(50, runs // 4), report=report, baseline=True)
        self.stdout.write("\nsummary: " + ", ".join(f"{k}={v:.3g}" for k, v in report.figures.items()))

    def _history(self, sizes: list[int]) -> None:
        figures = {}
        for size in sorted(sizes):
            have = history_bench.seeded_runs()
            if size > have:
                self.stdout.write(f"seeding {size - have} runs (to {size})")
                seeded = history_bench.seed(size - have, out=self.stdout.write)
                self.stdout.write(f"  {seeded['runs_per_s']:.0f} runs/s")
            self.stdout.write(f"measuring at {size} runs")
            figures[size] = history_bench.measure(out=self.stdout.write)
            figures[size]["storage bytes/run"] = (history_bench.storage_per_run() or {}).get("total", 0)
        self.stdout.write("\n" + history_bench.table(figures))
