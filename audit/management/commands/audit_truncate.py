"""``manage.py audit_truncate``: archive and cut each chain's prefix below a signed checkpoint older than the window."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from audit.anchors import truncate_all


class Command(BaseCommand):
    help = (
        "Truncate the audit ledger (docs/audit.md, Retention): per chain, export the prefix below the newest "
        "signed checkpoint older than the window, append a signed truncation anchor, then delete the prefix."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--days", type=int, default=None,
            help="retention window in days (default: AUTOPLANE_AUDIT_RETENTION_DAYS; 0 does nothing)",
        )  # fmt: skip

    def handle(self, *args, days: int | None, **options):
        days = settings.AUTOPLANE_AUDIT_RETENTION_DAYS if days is None else days
        if days < 0:
            raise CommandError("--days must be 0 (keep forever) or more")
        if not days:
            self.stdout.write("audit retention is off (AUTOPLANE_AUDIT_RETENTION_DAYS=0): nothing truncated")
            return
        for t in truncate_all(days=days):
            if t.file:
                self.stdout.write(
                    f"{t.chain}: continues from seq {t.from_seq}; {t.exported} events archived in {t.file}, "
                    f"{t.deleted} deleted"
                )
            elif t.deleted:
                self.stdout.write(
                    f"{t.chain}: {t.deleted} rows below seq {t.from_seq} deleted (earlier pass)"
                )
