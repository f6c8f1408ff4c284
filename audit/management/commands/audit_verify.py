"""``manage.py audit_verify``: walk the ledger; exit 1 naming the first broken link."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from audit.verify import verify_all


class Command(BaseCommand):
    help = (
        "Verify the audit ledger: every hash, every prev_hash link, seq continuity, the chain heads and the "
        "signed checkpoints (the sequenced prefix), and the entries still waiting for the sequencer. Exit 0 with the counts, or exit 1 naming the first broken link."
    )

    def add_arguments(self, parser):
        parser.add_argument("--chain", help="verify one chain only (e.g. ws-3 or platform)")
        parser.add_argument(
            "--since-checkpoint", action="store_true",
            help="walk each chain only from its newest signed checkpoint on (nightly); a full run checks every row",
        )  # fmt: skip
        parser.add_argument(
            "--jobs", type=int, default=None,
            help="chains verified at once, one process each (PostgreSQL; default: one per CPU)",
        )  # fmt: skip

    def handle(self, *args, chain: str | None, since_checkpoint: bool, jobs: int | None, **options):
        if jobs is not None and jobs < 1:
            raise CommandError("--jobs must be at least 1")
        result = verify_all([chain] if chain else None, since_checkpoint=since_checkpoint, jobs=jobs)
        if not result.ok:
            raise CommandError(result.summary(), returncode=1)
        self.stdout.write(result.summary())
