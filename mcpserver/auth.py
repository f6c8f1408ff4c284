"""Who an API token belongs to: the same tokens, and the same rules, as the REST API.

A token is the ``rest_framework.authtoken`` key that ``manage.py create_api_token``
prints (and ``Authorization: Token ...`` sends to the API). An unknown token and an
inactive user's token are both refused, the same way, so neither can be probed.
"""

from __future__ import annotations

from rest_framework.authtoken.models import Token

MAX_TOKEN_LENGTH = 200


def user_for_token(key: str | None):
    """The active user the token belongs to, or None."""
    key = (key or "").strip()
    if not key or len(key) > MAX_TOKEN_LENGTH:
        return None
    token = Token.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return None
    return token.user
