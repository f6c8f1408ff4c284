"""Who an API token belongs to: the REST API's hashed tokens (``workspaces.api_tokens``).

The MCP server takes only tokens scoped ``mcp`` (``manage.py create_api_token USER --scope
mcp``): such a token can look and run within its user's roles but never approve, deny or
administer, here or on the REST API, so a token that sits in an MCP client's configuration
(where a model's tools may read it) cannot decide an approval. An unknown, revoked or expired
token, an inactive user's token and a full-scope token are all refused the same way, so none
can be probed.
"""

from __future__ import annotations

from workspaces.api_tokens import TokenRefused, token_authenticate
from workspaces.models import TokenScope


def user_for_token(key: str | None):
    """The active user an ``mcp``-scoped token belongs to (its ``api_token_scope`` set), or None."""
    try:
        token = token_authenticate(key)
    except TokenRefused:
        return None
    if token.scope != TokenScope.MCP:
        return None
    return token.user
