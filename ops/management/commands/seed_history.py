"""``manage.py seed_history --runs N``: bulk-load realistic run history (issue 19's benchmark data)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from bench import history_bench


class Command(BaseCommand):
    help = (
        "Write N runs of two steps, with their 8 audit events each in chains that verify, into workspaces "
        "of its own (hist-0 … hist-9). Only on a test database: its name must say so, or pass "
        "--yes-this-is-a-test-database."
    )

    def add_arguments(self, parser):
        parser.add_argument("--runs", type=int, required=True)
        parser.add_argument("--days", type=int, default=30, help="spread the runs over the last DAYS days")
        parser.add_argument("--jobs", type=int, default=None, help="processes on PostgreSQL (default: one per "
                            "core, at most 2); each takes whole workspaces")  # fmt: skip
        parser.add_argument("--keep-indexes", action="store_true", help="insert into the indexes row by row (by "
                            "default, a seed that at least doubles the runs drops the secondary indexes and "
                            "builds them after)")  # fmt: skip
        parser.add_argument("--yes-this-is-a-test-database", action="store_true", dest="confirmed")

    def handle(
        self, *args, runs: int, days: int, jobs: int | None, keep_indexes: bool, confirmed: bool, **options
    ):
        try:
            name = history_bench.check_database(confirmed)
        except history_bench.NotATestDatabase as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"seeding {runs} runs into {name}")
        result = history_bench.seed(
            runs, days=days, jobs=jobs, defer_indexes=False if keep_indexes else None, out=self.stdout.write
        )
        self.stdout.write(
            f"{result['runs']} runs in {result['seconds']:.1f} s ({result['runs_per_s']:.0f} runs/s)"
        )
