"""``manage.py audit_checkpoint``: sign the heads of the chains that moved (as beat does periodically)."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from audit.checkpoints import checkpoint_write


class Command(BaseCommand):
    help = "Write a signed checkpoint for every chain whose head moved since its last checkpoint."

    def add_arguments(self, parser):
        parser.add_argument("--chain", help="checkpoint one chain only")

    def handle(self, *args, chain: str | None, **options):
        written = checkpoint_write(chain)
        for cp in written:
            self.stdout.write(
                f"checkpoint #{cp.id}: {cp.chain} seq {cp.seq} head {cp.head_hash} key {cp.key_id}"
            )
        self.stdout.write(f"{len(written)} checkpoint(s) written")
