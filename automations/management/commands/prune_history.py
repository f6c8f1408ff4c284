"""``manage.py prune_history``: delete finished runs past their workspace's retention (as beat does hourly)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from automations.retention import history_prune


class Command(BaseCommand):
    help = (
        "Delete finished runs (with their steps) older than AUTOPLANE_RUN_RETENTION_DAYS, in batches. "
        "Active runs and runs with pending approvals are kept; the audit ledger is not touched."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch", type=int, default=None, help="runs per transaction")
        parser.add_argument("--max-batches", type=int, default=None, help="stop after this many batches")

    def handle(self, *args, batch: int | None, max_batches: int | None, **options):
        result = history_prune(batch=batch, max_batches=max_batches)
        for slug, runs in sorted(result.by_workspace.items()):
            self.stdout.write(f"{slug}: {runs} runs pruned")
        more = "" if result.finished else " (stopped at --max-batches: run again for the rest)"
        self.stdout.write(
            f"{result.runs} runs and {result.steps} steps pruned in {result.batches} batches{more}"
        )
