"""``manage.py audit_export``: the ledger as JSON Lines, verifiable offline by audit/offline_verify.py."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from audit.export import export_jsonl


class Command(BaseCommand):
    help = (
        "Export events, signed checkpoints and the public keys as JSON Lines. Verify the file anywhere with "
        "`python audit/offline_verify.py FILE` (standard library + cryptography, no Django)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--chain", help="export one chain only (e.g. ws-3 or platform)")
        parser.add_argument("--output", "-o", help="file to write (default: standard output)")

    def handle(self, *args, chain: str | None, output: str | None, **options):
        chains = [chain] if chain else None
        if output:
            with open(output, "w", encoding="utf-8", newline="\n") as fh:
                counts = export_jsonl(fh, chains)
            self.stderr.write(
                f"exported {counts.events} events and {counts.checkpoints} checkpoints "
                f"from {counts.chains} chain(s) to {output}"
            )
        else:
            export_jsonl(self.stdout, chains)
