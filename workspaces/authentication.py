"""``Authorization: Token <token>`` for the REST API, checked against the hashed ``ApiToken`` rows,
and what a token's scope lets through.

The header keeps DRF's ``Token`` spelling, so existing clients and scripts work unchanged. A
malformed header, an unknown, revoked or expired token and an inactive user are each a 401
``UNAUTHENTICATED`` before any view runs. An ``mcp``-scoped token may read and do on the REST
API what the MCP server's tools do (run an automation, start a draft), nothing else: every
other write is a 403 ``PERMISSION_DENIED`` before the view runs (and ``workspaces.access``
refuses it approving and administering wherever those are checked).
"""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import SAFE_METHODS, BasePermission

from .api_tokens import TokenRefused, token_authenticate
from .models import TokenScope

KEYWORD = b"token"
# The REST routes (URL names) an mcp-scoped token may write to: the MCP tools' run_automation
# and create_draft.
MCP_WRITES = frozenset({"automation-run", "draft-create"})


class ApiTokenAuthentication(BaseAuthentication):
    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != KEYWORD:
            return None  # not ours: the session (or nothing) decides
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("invalid token header: 'Authorization: Token <token>'")
        try:
            key = parts[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("invalid token header: the token is ASCII") from None
        try:
            token = token_authenticate(key)
        except TokenRefused as exc:
            raise exceptions.AuthenticationFailed(exc.message) from None
        return token.user, token

    def authenticate_header(self, request) -> str:
        return "Token"


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """The API's ``tokenAuth`` security scheme (``/api/schema/``), as DRF's TokenAuthentication had it."""

    target_class = ApiTokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": 'Token-based authentication with required prefix "Token"'}  # fmt: skip


class TokenScopeAllows(BasePermission):
    """A default permission class (with ``IsAuthenticated``): sessions and full tokens pass."""

    message = "an 'mcp'-scoped token may only read, run automations and start drafts"

    def has_permission(self, request, view) -> bool:
        scope = getattr(request.user, "api_token_scope", None)
        if scope is None or scope == TokenScope.FULL or request.method in SAFE_METHODS:
            return True
        match = getattr(request, "resolver_match", None)
        return scope == TokenScope.MCP and match is not None and match.url_name in MCP_WRITES
