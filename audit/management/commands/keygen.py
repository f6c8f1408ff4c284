"""``manage.py keygen``: create (or rotate) the platform's Ed25519 signing key file."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from audit import signing


class Command(BaseCommand):
    help = (
        "Write a new Ed25519 signing key to AUTOPLANE_SIGNING_KEY_FILE (or --path). Prints the key id and "
        "public key, never the private key. --rotate keeps the old public key as a retired key so old "
        "signatures still verify."
    )

    def add_arguments(self, parser):
        parser.add_argument("--path", help="key file to write (default: AUTOPLANE_SIGNING_KEY_FILE)")
        parser.add_argument("--force", action="store_true", help="replace an existing key file")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="retire the current key file's public key (written to <dir>/retired_keys/) and write a new key",
        )

    def handle(self, *args, path: str | None, force: bool, rotate: bool, **options):
        key_file = Path(path) if path else Path(settings.AUTOPLANE_SIGNING_KEY_FILE)
        if rotate:
            if not key_file.exists():
                raise CommandError(f"{key_file} does not exist: nothing to rotate")
            try:
                old = signing.read_key_file(key_file)
            except ImproperlyConfigured as exc:
                raise CommandError(str(exc)) from None
            retired = signing.retire_public_key(old.public_key(), key_file)
            self.stdout.write(
                f"retired key {signing.key_id_for(old.public_key())}: public key kept in {retired}"
            )
            force = True
        try:
            key = signing.generate_key_file(key_file, force=force)
        except FileExistsError:
            raise CommandError(
                f"{key_file} already exists; use --force to replace it or --rotate to rotate it"
            )
        public = key.public_key()
        self.stdout.write(f"wrote {key_file} (mode 0600)")
        self.stdout.write(f"key_id: {signing.key_id_for(public)}")
        self.stdout.write(f"public_key: {signing.b64url(signing.raw_public_bytes(public))}")
        self.stdout.write(signing.public_pem(public).rstrip())
        if settings.AUTOPLANE_SIGNING_KEY:
            self.stderr.write(
                "note: AUTOPLANE_SIGNING_KEY is set and takes precedence over the key file; unset it to use this key"
            )
