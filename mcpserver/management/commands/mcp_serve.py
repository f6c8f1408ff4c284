"""``manage.py mcp_serve``: the platform's MCP server over stdio (default) or streamable HTTP."""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from mcpserver import server
from mcpserver.auth import user_for_token


class Command(BaseCommand):
    help = (
        "Serve autoplane's MCP tools. Default: stdio, authenticated by the API token in "
        "AUTOPLANE_API_TOKEN (for desktop MCP clients). --http: streamable HTTP at "
        "http://HOST:PORT/mcp, each request authenticated by 'Authorization: Bearer <API token>'. "
        "Only 'mcp'-scoped tokens are taken (create_api_token USER --scope mcp)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
        parser.add_argument("--host", default=settings.AUTOPLANE_MCP_HOST, help="HTTP bind address")
        parser.add_argument("--port", type=int, default=settings.AUTOPLANE_MCP_PORT, help="HTTP port")
        parser.add_argument("--path", default="/mcp", help="HTTP path of the MCP endpoint")

    def handle(self, *args, http: bool, host: str, port: int, path: str, **options):
        if http:
            if not path.startswith("/"):
                raise CommandError("--path must start with '/'")
            self.stderr.write(f"autoplane MCP server: streamable HTTP at http://{host}:{port}{path}")
            server.serve_http(host=host, port=port, path=path)
            return
        token = settings.AUTOPLANE_API_TOKEN
        # Refuse before speaking MCP at all: nothing is listed to a client without a valid token.
        try:
            user = user_for_token(token)
        except DatabaseError as exc:
            raise CommandError(
                f"the database is unavailable ({type(exc).__name__}); check DATABASE_URL"
            ) from None
        if user is None:
            raise CommandError(
                "AUTOPLANE_API_TOKEN is missing or is not a valid 'mcp'-scoped API token (the MCP server "
                "takes no full-scope token; create one with `manage.py create_api_token <user> --scope mcp`)"
            )
        server.serve_stdio(token)
