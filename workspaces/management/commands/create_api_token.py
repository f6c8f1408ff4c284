from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from config.errors import ServiceError
from workspaces.models import Role
from workspaces.services import api_token_create


class Command(BaseCommand):
    help = "Create (if missing) a user, workspace and membership, and print a new API token for the user."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--workspace", default="default")
        parser.add_argument("--role", default=Role.ADMIN, choices=Role.values)

    def handle(self, *args, username: str, workspace: str, role: str, **options):
        if not username.strip():
            raise CommandError("username must not be empty")
        try:
            token = api_token_create(username=username, workspace_slug=workspace, role=role, actor="cli")
        except ServiceError as exc:  # e.g. LAST_ADMIN: demoting the workspace's last admin
            raise CommandError(f"{exc.code}: {exc.message}") from None
        self.stdout.write(token)
