"""API tokens: made, listed, revoked and checked here (the command, the API, the admin, the REST
authentication and the MCP server all call these).

A token is ``apk_`` + 43 random URL-safe characters; only its sha256 is stored (the scheme of
the webhook tokens, ``triggers.services.token_hash``), with its first 12 characters as a
visible ``prefix``. Checking a token is one lookup of that digest on a unique index: a guess
that differs in any character finds nothing (there is no prefix or partial match), and the
comparison an attacker could time is between digests of their own guesses.
"""

from __future__ import annotations

import hashlib
import secrets
import unicodedata
import uuid
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.utils import timezone

from audit import writer
from config.errors import InvalidArgument, ServiceError

from .models import ApiToken, TokenScope

TOKEN_PREFIX = "apk_"  # noqa: S105 - a prefix, not a secret
PREFIX_LENGTH = len(TOKEN_PREFIX) + 8
MAX_TOKEN_LENGTH = 200
MAX_NAME_LENGTH = 100
# last_used_at is written at most this often per token: one UPDATE a minute, not one a request.
LAST_USED_RESOLUTION = timedelta(seconds=60)
DEFAULT_NAME = "token"


class TokenRefused(Exception):
    """Why a presented token does not authenticate (the message is safe to send back)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def _trace() -> str:
    return uuid.uuid4().hex


def name_check(name: object) -> str:
    text = name.strip() if isinstance(name, str) else ""
    if not text or len(text) > MAX_NAME_LENGTH or any(unicodedata.category(c)[0] == "C" for c in text):
        raise InvalidArgument([{"path": "/name", "code": "invalid_name",
                                "message": f"a token name is 1 to {MAX_NAME_LENGTH} printable characters"}])  # fmt: skip
    return text


def _free_name(user) -> str:
    taken = set(
        ApiToken.objects.filter(user=user, name__startswith=DEFAULT_NAME).values_list("name", flat=True)
    )
    if DEFAULT_NAME not in taken:
        return DEFAULT_NAME
    n = 2
    while f"{DEFAULT_NAME}-{n}" in taken:
        n += 1
    return f"{DEFAULT_NAME}-{n}"


@transaction.atomic
def token_create(*, user, name: str | None = None, scope: str = TokenScope.FULL, expires_at: datetime | None = None,
                 replace: str | None = None, actor: str = "system",
                 workspace_id: int | None = None) -> tuple[ApiToken, str]:  # fmt: skip
    """A new token for ``user``; returns the row and the token (shown once, never stored).

    Another token never disappears by this: a name that is taken is a 409 unless ``replace``
    names that token, which is then revoked in the same transaction (a rotation).
    """
    if scope not in TokenScope.values:
        raise InvalidArgument([{"path": "/scope", "code": "invalid_choice",
                                "message": f"{scope!r} is not one of {', '.join(TokenScope.values)}"}])  # fmt: skip
    if expires_at is not None and expires_at <= timezone.now():
        raise InvalidArgument(
            [{"path": "/expires_at", "code": "in_past", "message": "expires_at is in the past"}]
        )
    replaced = None
    if replace is not None:
        replace = name_check(replace)
        replaced = ApiToken.objects.select_for_update().filter(user=user, name=replace).first()
        if replaced is None:
            raise ServiceError(
                "NOT_FOUND", f"{user.get_username()} has no token named {replace!r} to replace", 404
            )
        name = replace if name is None else name
    name = _free_name(user) if name is None else name_check(name)
    if replaced is not None:
        replaced.delete()
    if ApiToken.objects.filter(user=user, name=name).exists():
        raise ServiceError("CONFLICT", f"{user.get_username()} already has a token named {name!r}: "
                           "revoke it, replace it, or choose another name", 409)  # fmt: skip
    key = _new_token()
    try:
        with transaction.atomic():
            token = ApiToken.objects.create(user=user, name=name, digest=token_digest(key), prefix=key[:PREFIX_LENGTH],
                                            scope=scope, expires_at=expires_at)  # fmt: skip
    except IntegrityError:  # the same name, made by a concurrent request
        raise ServiceError(
            "CONFLICT", f"{user.get_username()} already has a token named {name!r}", 409
        ) from None
    writer.append(
        trace_id=_trace(), type="operator.api_token.created",
        summary=f"API token {name!r} ({token.prefix}…, scope {scope}) created for {user.get_username()}",
        workspace_id=workspace_id, actor=actor, secrets=[key],
        payload={"user": user.get_username(), "name": name, "prefix": token.prefix, "scope": scope,
                 "expires_at": expires_at.isoformat() if expires_at else None,
                 "replaced": replaced.prefix if replaced is not None else None},
    )  # fmt: skip
    return token, key


def expires_in_days(days: int | None) -> datetime | None:
    if days is None:
        return None
    if not 1 <= days <= 3650:
        raise InvalidArgument([{"path": "/expires_in_days", "code": "out_of_range",
                                "message": "expires_in_days is 1 to 3650"}])  # fmt: skip
    return timezone.now() + timedelta(days=days)


@transaction.atomic
def token_revoke(*, token: ApiToken, actor: str = "system") -> None:
    """Delete the token: the next request that presents it is a 401."""
    username, name, prefix = token.user.get_username(), token.name, token.prefix
    deleted, _ = ApiToken.objects.filter(pk=token.pk).delete()
    if not deleted:
        return
    writer.append(
        trace_id=_trace(), type="operator.api_token.revoked",
        summary=f"API token {name!r} ({prefix}…) of {username} revoked", actor=actor,
        payload={"user": username, "name": name, "prefix": prefix},
    )  # fmt: skip


def tokens_of(user):
    return ApiToken.objects.filter(user=user).order_by("created_at", "pk")


def token_authenticate(key: str | None) -> ApiToken:
    """The token row (with its user) ``key`` is, or :class:`TokenRefused`.

    Sets ``user.api_token_scope``, which :mod:`workspaces.access` reads: a scoped token's
    permissions are its user's role's, intersected with the scope's.
    """
    key = (key or "").strip()
    if not key or len(key) > MAX_TOKEN_LENGTH:
        raise TokenRefused("invalid token")
    rows = list(ApiToken.objects.select_related("user").filter(digest=token_digest(key)).order_by()[:1])
    if not rows or not rows[0].user.is_active:
        raise TokenRefused("invalid token")
    token = rows[0]
    now = timezone.now()
    if token.expires_at is not None and token.expires_at <= now:
        raise TokenRefused("the token has expired")
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    setattr(token.user, "api_token_scope", token.scope)  # noqa: B010 - not a field: this request's scope
    return token
