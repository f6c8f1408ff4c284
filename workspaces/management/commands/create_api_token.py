from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from config.errors import ServiceError
from workspaces.api_tokens import expires_in_days
from workspaces.models import Membership, Role, TokenScope
from workspaces.services import api_token_create


class Command(BaseCommand):
    help = (
        "Create (if missing) a user, workspace and membership, and print a new API token for the user "
        "(once: only its hash is stored). Without --role a new member is a viewer and an existing "
        "member keeps their role. The user's other tokens stay; --replace NAME rotates one."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--workspace", default="default")
        parser.add_argument("--role", default=None, choices=Role.values,
                            help="the user's role in the workspace (default: keep it; a new member is a viewer)")  # fmt: skip
        parser.add_argument(
            "--name", default=None, help="the token's name (default: 'token', 'token-2', ...)"
        )
        parser.add_argument("--expires-days", type=int, default=None, help="expire the token after N days")
        parser.add_argument("--scope", default=TokenScope.FULL, choices=TokenScope.values,
                            help="'mcp' for the MCP server: it can look and run, never approve or administer")  # fmt: skip
        parser.add_argument("--replace", default=None, metavar="NAME",
                            help="revoke the user's token NAME and make its successor (same name unless --name)")  # fmt: skip

    def handle(self, *args, username: str, workspace: str, role: str | None, name: str | None,
               expires_days: int | None, scope: str, replace: str | None, **options):  # fmt: skip
        if not username.strip():
            raise CommandError("username must not be empty")
        try:
            token = api_token_create(username=username, workspace_slug=workspace, role=role, actor="cli",
                                     name=name, scope=scope, expires_at=expires_in_days(expires_days),
                                     replace=replace)  # fmt: skip
        except ServiceError as exc:  # LAST_ADMIN, CONFLICT (name taken), NOT_FOUND (--replace), bad values
            details = "; ".join(e["message"] for e in exc.errors or [])
            raise CommandError(f"{exc.code}: {details or exc.message}") from None
        held = Membership.objects.filter(workspace__slug=workspace, user__username=username).values_list(
            "role", flat=True
        )
        self.stderr.write(f"{username} is {held.first()} in {workspace}; token scope {scope} (shown once)")
        self.stdout.write(token)
