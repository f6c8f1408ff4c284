"""Re-encrypt every credential under the newest key of AUTOPLANE_CREDENTIAL_KEYS."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from capabilities.credentials import CredentialKeyError, credentials_rotate


class Command(BaseCommand):
    help = (
        "Re-encrypt every credential under the newest key (the first of AUTOPLANE_CREDENTIAL_KEYS). "
        "Put the new key first, keep the old ones after it, run this, then drop the old keys."
    )

    def handle(self, *args, **options) -> None:
        try:
            count = credentials_rotate()
        except CredentialKeyError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(self.style.SUCCESS(f"re-encrypted {count} credential(s) under the newest key"))
