"""``Authorization: Token <token>`` for the REST API, checked against the hashed ``ApiToken`` rows.

The header keeps DRF's ``Token`` spelling, so existing clients and scripts work unchanged. A
malformed header, an unknown, revoked or expired token and an inactive user are each a 401
``UNAUTHENTICATED`` before any view runs.
"""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from .api_tokens import TokenRefused, token_authenticate

KEYWORD = b"token"


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
