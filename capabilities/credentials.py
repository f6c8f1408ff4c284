"""Credentials: encrypted at rest, write-only, resolved per call (SPEC §5.2).

Encryption is Fernet under a :class:`~cryptography.fernet.MultiFernet`: the
newest key encrypts, every configured key decrypts. Keys come from
``AUTOPLANE_CREDENTIAL_KEYS`` (comma-separated Fernet keys, newest first).

Embedded default: with no keys configured, one key is generated on first use
into ``DATA_DIR/credential_keys`` (mode 0600; one key per line, newest first).
That file *is* the secret protecting every credential: back it up with the
database, and in production set ``AUTOPLANE_CREDENTIAL_KEYS`` instead.

Rotation: put a new key in front of the list (``Fernet.generate_key()``), run
``manage.py rotate_credentials`` to re-encrypt every row under it, then drop
the old key.

Plaintext lives only in local variables of :func:`credential_resolve` and its
callers: never on a model instance, never in a log line, never in an audit
payload (every audit call passes the values as ``secrets=``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from audit import writer
from audit.models import Outcome
from config.errors import ServiceError

from . import egress, grants
from .base import ErrorCode, StepFailure
from .models import Credential, CredentialKind

logger = logging.getLogger(__name__)

KEY_FILE_NAME = "credential_keys"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,99}$")
HEADER_NAME_PATTERN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")
MAX_SECRET_FIELD_CHARS = 16 * 1024
REFRESH_SKEW = timedelta(seconds=60)
REFRESH_TIMEOUT_SECONDS = 15.0

# Per kind: (required secret fields, optional secret fields, required metadata, optional metadata).
KIND_FIELDS: dict[str, tuple[frozenset[str], frozenset[str], frozenset[str], frozenset[str]]] = {
    CredentialKind.BEARER: (frozenset({"token"}), frozenset(), frozenset(), frozenset()),
    CredentialKind.BASIC: (frozenset({"username", "password"}), frozenset(), frozenset(), frozenset()),
    CredentialKind.HEADER: (frozenset({"value"}), frozenset(), frozenset({"header_name"}), frozenset()),
    CredentialKind.OAUTH2: (
        frozenset({"refresh_token"}),
        frozenset({"access_token", "client_secret"}),
        frozenset({"token_url", "client_id"}),
        frozenset({"scopes", "expires_at"}),
    ),
}
# Fields that are not secret even though they travel with the secret (never redacted).
_NOT_SECRET = frozenset({"username"})


class CredentialError(ServiceError):
    """A credential request that cannot be honoured; ``message`` is safe to show.

    An invalid argument names its ``path``; a conflict (the credential is in use) is 409.
    """

    def __init__(self, code: str, message: str, *, path: str = "/"):
        errors = [{"path": path, "code": code, "message": message}] if code == "INVALID_ARGUMENT" else None
        super().__init__(code, message, 409 if code == "CONFLICT" else 400, errors=errors)
        self.path = path


class CredentialKeyError(ImproperlyConfigured):
    pass


# --- keys --------------------------------------------------------------------


def _key_file() -> Path:
    return Path(settings.DATA_DIR) / KEY_FILE_NAME


def _embedded_keys() -> list[str]:
    """The keys in DATA_DIR/credential_keys, creating the file with one new key if absent."""
    path = _key_file()
    if not path.exists():
        # Write a private temp file and hard-link it into place: the link fails if
        # another process got there first, and nobody ever reads a half-written file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".credential_keys.")
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, Fernet.generate_key() + b"\n")
            os.close(fd)
            try:
                os.link(tmp, path)
                logger.warning(
                    "generated a credential encryption key in %s; back it up with the database", path
                )
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
    return [
        line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")
    ]


def configured_keys() -> tuple[str, ...]:
    keys = [k.strip() for k in (settings.AUTOPLANE_CREDENTIAL_KEYS or []) if k and k.strip()]
    return tuple(keys or _embedded_keys())


@lru_cache(maxsize=8)
def _multifernet(keys: tuple[str, ...]) -> MultiFernet:
    if not keys:
        raise CredentialKeyError("no credential encryption keys are configured")
    fernets = []
    for index, key in enumerate(keys):
        try:
            fernets.append(Fernet(key.encode()))
        except (ValueError, binascii.Error) as exc:
            # Never echo the key itself.
            raise CredentialKeyError(f"credential key #{index + 1} is not a valid Fernet key") from exc
    return MultiFernet(fernets)


def fernet() -> MultiFernet:
    return _multifernet(configured_keys())


def encrypt(secret: Mapping[str, str]) -> str:
    return fernet().encrypt(json.dumps(dict(secret), sort_keys=True).encode()).decode()


def decrypt(token: str) -> dict[str, str]:
    return json.loads(fernet().decrypt(token.encode()))


# --- validation ----------------------------------------------------------------


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise CredentialError(
            "INVALID_ARGUMENT", "name must be 1-100 letters, digits, '-' or '_', starting with a letter or digit",
            path="/name",
        )  # fmt: skip
    return name


def _check_kind(kind: Any) -> str:
    if kind not in KIND_FIELDS:
        raise CredentialError(
            "INVALID_ARGUMENT", f"kind must be one of {', '.join(KIND_FIELDS)}", path="/kind"
        )
    return str(kind)


def check_secret(kind: str, secret: Any, *, partial: bool = False) -> dict[str, str]:
    required, optional, _, _ = KIND_FIELDS[kind]
    if not isinstance(secret, Mapping):
        raise CredentialError("INVALID_ARGUMENT", "secret must be an object", path="/secret")
    unknown = set(secret) - required - optional
    if unknown:
        # Field names only: the values are secret.
        raise CredentialError(
            "INVALID_ARGUMENT",
            f"unknown secret field(s) for {kind}: {', '.join(sorted(unknown))}",
            path="/secret",
        )
    missing = set() if partial else required - set(secret)
    if missing:
        raise CredentialError(
            "INVALID_ARGUMENT",
            f"missing secret field(s) for {kind}: {', '.join(sorted(missing))}",
            path="/secret",
        )
    clean: dict[str, str] = {}
    for key, value in secret.items():
        if not isinstance(value, str) or not value or len(value) > MAX_SECRET_FIELD_CHARS:
            raise CredentialError(
                "INVALID_ARGUMENT", f"secret field '{key}' must be a non-empty string", path=f"/secret/{key}"
            )
        if "\r" in value or "\n" in value:
            raise CredentialError(
                "INVALID_ARGUMENT",
                f"secret field '{key}' must not contain line breaks",
                path=f"/secret/{key}",
            )
        clean[key] = value
    return clean


def check_metadata(kind: str, metadata: Any) -> dict[str, Any]:
    _, _, required, optional = KIND_FIELDS[kind]
    metadata = {} if metadata is None else metadata
    if not isinstance(metadata, Mapping):
        raise CredentialError("INVALID_ARGUMENT", "metadata must be an object", path="/metadata")
    missing = required - set(metadata)
    if missing:
        raise CredentialError(
            "INVALID_ARGUMENT", f"missing metadata field(s) for {kind}: {', '.join(sorted(missing))}",
            path="/metadata",
        )  # fmt: skip
    clean = dict(metadata)
    if len(json.dumps(clean, default=str)) > 8192:
        raise CredentialError("INVALID_ARGUMENT", "metadata is too large", path="/metadata")
    if kind == CredentialKind.HEADER:
        header_name = clean.get("header_name")
        if not isinstance(header_name, str) or not HEADER_NAME_PATTERN.match(header_name):
            raise CredentialError("INVALID_ARGUMENT", "header_name is not a valid HTTP header name",
                                  path="/metadata/header_name")  # fmt: skip
    if kind == CredentialKind.OAUTH2:
        for key in ("token_url", "client_id"):
            if not isinstance(clean.get(key), str) or not clean[key]:
                raise CredentialError(
                    "INVALID_ARGUMENT", f"{key} must be a non-empty string", path=f"/metadata/{key}"
                )
        if not re.match(r"^https?://", clean["token_url"], re.IGNORECASE):
            raise CredentialError(
                "INVALID_ARGUMENT", "token_url must be an http(s) URL", path="/metadata/token_url"
            )
        scopes = clean.get("scopes")
        if scopes is not None and not (
            isinstance(scopes, str) or (isinstance(scopes, list) and all(isinstance(s, str) for s in scopes))
        ):
            raise CredentialError("INVALID_ARGUMENT", "scopes must be a string or a list of strings",
                                  path="/metadata/scopes")  # fmt: skip
        if clean.get("expires_at") is not None and _parse_time(clean["expires_at"]) is None:
            raise CredentialError("INVALID_ARGUMENT", "expires_at must be an ISO 8601 time",
                                  path="/metadata/expires_at")  # fmt: skip
    return clean


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def secret_values(kind: str, secret: Mapping[str, str]) -> list[str]:
    """Every value that must be redacted wherever it might appear (incl. encoded forms)."""
    values = [v for k, v in secret.items() if k not in _NOT_SECRET and isinstance(v, str) and v]
    if kind == CredentialKind.BASIC and secret.get("username") and secret.get("password"):
        values.append(base64.b64encode(f"{secret['username']}:{secret['password']}".encode()).decode())
    return values


# --- services ------------------------------------------------------------------


def _audit(credential: Credential, type: str, summary: str, *, user=None, secrets: Iterable[str] = (),
           payload: dict[str, Any] | None = None, trace_id: str | None = None,
           outcome: str = Outcome.SUCCESS) -> None:  # fmt: skip
    writer.append(
        trace_id=trace_id or uuid.uuid4().hex, type=type, summary=summary, outcome=outcome,
        workspace_id=credential.workspace_id, stage="credentials", actor=writer.actor_for(user),
        refs={"credential": str(credential.pk)},
        payload={"name": credential.name, "kind": credential.kind, **(payload or {})},
        secrets=list(secrets),
    )  # fmt: skip


@transaction.atomic
def credential_create(
    *,
    workspace,
    name: str,
    kind: str,
    secret: Mapping[str, Any],
    metadata: Mapping[str, Any] | None = None,
    allowed_destinations: Any = (),
    allow_code_steps: bool = False,
    allowed_automations: Any = None,
    approval_always: bool = False,
    user=None,
) -> Credential:
    name = _check_name(name)
    kind = _check_kind(kind)
    clean_secret = check_secret(kind, secret)
    clean_metadata = check_metadata(kind, metadata)
    grant = check_grant(
        {"allowed_destinations": list(allowed_destinations), "allow_code_steps": allow_code_steps,
         "allowed_automations": allowed_automations, "approval_always": approval_always}
    )  # fmt: skip
    if Credential.objects.filter(workspace=workspace, name=name).exists():
        raise CredentialError(
            "CONFLICT", f"a credential named '{name}' already exists in this workspace", path="/name"
        )
    credential = Credential.objects.create(
        workspace=workspace, name=name, kind=kind, encrypted_value=encrypt(clean_secret), metadata=clean_metadata,
        created_by=user if user is not None and user.is_authenticated else None, **grant,
    )  # fmt: skip
    _audit(credential, "credential.created", f"credential {name} ({kind}) created", user=user,
           secrets=secret_values(kind, clean_secret), payload={"metadata_keys": sorted(clean_metadata), **grant})  # fmt: skip
    return credential


@transaction.atomic
def credential_update_secret(
    *, credential: Credential, secret: Mapping[str, Any] | None = None, metadata: Mapping[str, Any] | None = None,
    grant: Mapping[str, Any] | None = None, user=None,
) -> Credential:  # fmt: skip
    """Replace the secret (all fields), the metadata and/or grant fields; the old value is never returned."""
    credential = Credential.objects.select_for_update().get(pk=credential.pk)
    changed: list[str] = []
    secrets: list[str] = []
    fields = ["updated_at"]
    if secret is not None:
        clean_secret = check_secret(credential.kind, secret)
        credential.encrypted_value = encrypt(clean_secret)
        secrets = secret_values(credential.kind, clean_secret)
        changed.append("secret")
        fields.append("encrypted_value")
    if metadata is not None:
        credential.metadata = check_metadata(credential.kind, metadata)
        changed.append("metadata")
        fields.append("metadata")
    granted: dict[str, Any] = {}
    if grant:
        current = {field: getattr(credential, field) for field in GRANT_FIELDS}
        granted = {k: v for k, v in check_grant({**current, **grant}).items() if k in grant}
        for field, value in granted.items():
            setattr(credential, field, value)
        changed.append("grants")
        fields.extend(granted)
    if not changed:
        return credential
    credential.save(update_fields=fields)
    _audit(credential, "credential.updated", f"credential {credential.name}: {' and '.join(changed)} replaced",
           user=user, secrets=secrets, payload={"changed": changed, **granted})  # fmt: skip
    return credential


@transaction.atomic
def credential_delete(*, credential: Credential, user=None) -> None:
    users = list(credential.mcp_servers.values_list("slug", flat=True))
    if users:
        raise CredentialError("CONFLICT", f"the credential is used by MCP server(s): {', '.join(users)}")
    _audit(credential, "credential.deleted", f"credential {credential.name} deleted", user=user)
    credential.delete()


def credential_names(workspace_id: int) -> set[str]:
    return set(Credential.objects.filter(workspace_id=workspace_id).values_list("name", flat=True))


# approval_always is no grant but a condition of every use (a step using it asks a human); it is
# set, checked and audited the same way.
GRANT_FIELDS = ("allowed_destinations", "allow_code_steps", "allowed_automations", "approval_always")


def check_grant(grant: Mapping[str, Any]) -> dict[str, Any]:
    """The grant fields, validated (CredentialError naming the field otherwise)."""
    unknown = set(grant) - set(GRANT_FIELDS)
    if unknown:
        raise CredentialError("INVALID_ARGUMENT", f"unknown grant field(s): {', '.join(sorted(unknown))}")
    try:
        destinations = grants.check_destinations(grant.get("allowed_destinations", []))
        automations = grants.check_automations(grant.get("allowed_automations"))
    except grants.GrantError as exc:
        raise CredentialError("INVALID_ARGUMENT", exc.message, path=exc.path) from None
    code = grant.get("allow_code_steps", False)
    if not isinstance(code, bool):
        raise CredentialError(
            "INVALID_ARGUMENT", "allow_code_steps must be true or false", path="/allow_code_steps"
        )
    always = grant.get("approval_always", False)
    if not isinstance(always, bool):
        raise CredentialError(
            "INVALID_ARGUMENT", "approval_always must be true or false", path="/approval_always"
        )
    return {
        "allowed_destinations": destinations,
        "allow_code_steps": code,
        "allowed_automations": automations,
        "approval_always": always,
    }


def grant_of(credential: Credential) -> grants.Grant:
    automations = credential.allowed_automations
    return grants.Grant(
        allowed_destinations=tuple(credential.allowed_destinations or ()),
        allow_code_steps=bool(credential.allow_code_steps),
        allowed_automations=None if automations is None else frozenset(automations),
    )


def credential_grants(workspace_id: int) -> dict[str, grants.Grant]:
    """Every credential of the workspace by name, with its grant (for save-time validation)."""
    return {c.name: grant_of(c) for c in Credential.objects.filter(workspace_id=workspace_id).only(
        "name", *GRANT_FIELDS)}  # fmt: skip


def _check_use(
    credential: Credential, *, automation_id: Any, destination: str | None, code_step: bool
) -> None:
    grant, name = grant_of(credential), credential.name
    if automation_id is not None and not grant.allows_automation(automation_id):
        raise StepFailure(
            ErrorCode.POLICY_VIOLATION, f"credential '{name}' is not granted to this automation"
        )
    if code_step and not grant.allow_code_steps:
        raise StepFailure(ErrorCode.POLICY_VIOLATION, f"credential '{name}' may not be given to code steps")
    if destination is not None and not grant.allows_destination(destination):
        raise StepFailure(ErrorCode.POLICY_VIOLATION,
                          f"credential '{name}' may not be sent to this destination (see its allowed_destinations)")  # fmt: skip


def credential_resolve(
    *,
    workspace_id: int,
    name: str,
    trace_id: str | None = None,
    automation_id: Any = None,
    destination: str | None = None,
    code_step: bool = False,
) -> tuple[dict[str, Any], list[str]]:
    """Decrypt ``name`` in ``workspace_id`` now: ``(value, secret strings to redact)``.

    ``value`` carries ``kind`` and the secret fields (for oauth2 a fresh
    ``access_token``, also as ``token``; the refresh token and client secret
    stay here). A credential of another workspace does not exist for this call. The use is checked against the credential's grants first
    (``POLICY_VIOLATION``): the automation, a code step, the destination URL.
    """
    credential = Credential.objects.filter(workspace_id=workspace_id, name=name).first()
    if credential is None:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, f"no credential named '{name}' in this workspace")
    _check_use(credential, automation_id=automation_id, destination=destination, code_step=code_step)
    secret = _decrypt_row(credential)
    if credential.kind == CredentialKind.OAUTH2:
        secret = _fresh_oauth2(credential, secret, trace_id=trace_id)
        value = {
            "kind": credential.kind,
            "access_token": secret["access_token"],
            "token": secret["access_token"],
            "expires_at": credential.metadata.get("expires_at"),
        }
    else:
        value = {"kind": credential.kind, **secret}
        if credential.kind == CredentialKind.HEADER:
            value["header_name"] = credential.metadata["header_name"]
    return value, secret_values(credential.kind, secret)


def _decrypt_row(credential: Credential) -> dict[str, str]:
    try:
        return decrypt(credential.encrypted_value)
    except InvalidToken:
        logger.error("credential %s cannot be decrypted with the configured keys", credential.pk)
        raise StepFailure(
            ErrorCode.INTERNAL, f"credential '{credential.name}' cannot be decrypted; an operator must check the keys",
            retryable=False,
        )  # fmt: skip


# --- oauth2 refresh -------------------------------------------------------------


def _needs_refresh(credential: Credential, secret: Mapping[str, str]) -> bool:
    if not secret.get("access_token"):
        return True
    expires_at = _parse_time(credential.metadata.get("expires_at"))
    return expires_at is not None and expires_at - REFRESH_SKEW <= timezone.now()


def _fresh_oauth2(credential: Credential, secret: dict[str, str], *, trace_id: str | None) -> dict[str, str]:
    """Return ``secret`` with a usable access token, refreshing (and storing) it if needed.

    The token request runs outside any transaction; the new value is stored
    with a compare-and-swap on the ciphertext, so when two workers refresh at
    once the first write wins and the other uses what it stored.
    """
    if not _needs_refresh(credential, secret):
        return secret
    old_token = credential.encrypted_value
    fresh, expires_at = _request_token(credential, secret)
    metadata = {**credential.metadata, "expires_at": expires_at.isoformat() if expires_at else None}
    new_token = encrypt(fresh)
    with transaction.atomic():
        updated = Credential.objects.filter(pk=credential.pk, encrypted_value=old_token).update(
            encrypted_value=new_token, metadata=metadata, updated_at=timezone.now()
        )
        if updated:
            credential.encrypted_value, credential.metadata = new_token, metadata
            _audit(credential, "credential.refreshed", f"oauth2 access token for {credential.name} refreshed",
                   secrets=secret_values(credential.kind, {**secret, **fresh}), trace_id=trace_id,
                   payload={"expires_at": metadata["expires_at"]})  # fmt: skip
            return fresh
    credential.refresh_from_db()
    theirs = _decrypt_row(credential)
    return theirs if theirs.get("access_token") else fresh


def _request_token(
    credential: Credential, secret: Mapping[str, str]
) -> tuple[dict[str, str], datetime | None]:
    metadata = credential.metadata
    form = {
        "grant_type": "refresh_token",
        "refresh_token": secret["refresh_token"],
        "client_id": metadata["client_id"],
    }
    if secret.get("client_secret"):
        form["client_secret"] = secret["client_secret"]
    scopes = metadata.get("scopes")
    if scopes:
        form["scope"] = scopes if isinstance(scopes, str) else " ".join(scopes)
    body = "&".join(f"{_quote(k)}={_quote(v)}" for k, v in form.items()).encode()
    allowlist = egress.effective_allowlist(credential.workspace.egress_allowlist or ())
    host = egress.parse_url(metadata["token_url"]).host
    failure = StepFailure(ErrorCode.TEMPORARILY_UNAVAILABLE, f"could not refresh the oauth2 token for "
                          f"'{credential.name}' at {host}", retryable=True)  # fmt: skip
    try:
        with egress.EgressClient(allowlist) as client:
            headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
            with client.stream("POST", metadata["token_url"], content=body, headers=headers,
                               timeout=REFRESH_TIMEOUT_SECONDS) as response:  # fmt: skip
                raw = response.read()[:65536]
                status = response.status_code
    except StepFailure:
        raise  # the SSRF guard refused the token URL
    except Exception as exc:  # httpx errors; never include the request (it holds the refresh token)
        logger.warning("oauth2 refresh for credential %s failed: %s", credential.pk, type(exc).__name__)
        raise failure
    if status >= 500 or status == 429:
        raise failure
    try:
        answer = json.loads(raw)
    except ValueError:
        answer = {}
    access_token = answer.get("access_token") if isinstance(answer, dict) else None
    if status >= 400 or not isinstance(access_token, str) or not access_token:
        # 4xx: the refresh token was refused (revoked, expired); retrying will not help.
        logger.warning("oauth2 refresh for credential %s refused with HTTP %s", credential.pk, status)
        raise StepFailure(
            ErrorCode.INVALID_ARGUMENT,
            f"the token endpoint refused to refresh credential '{credential.name}' (HTTP {status}); "
            "an admin must replace it",
            retryable=False,
        )
    fresh = {"refresh_token": secret["refresh_token"], "access_token": access_token}
    if isinstance(answer.get("refresh_token"), str) and answer["refresh_token"]:
        fresh["refresh_token"] = answer["refresh_token"]  # the provider rotated it
    if secret.get("client_secret"):
        fresh["client_secret"] = secret["client_secret"]
    expires_in = answer.get("expires_in")
    expires_at = None
    if isinstance(expires_in, int | float) and not isinstance(expires_in, bool) and expires_in > 0:
        expires_at = timezone.now() + timedelta(seconds=float(expires_in))
    return fresh, expires_at


def _quote(value: str) -> str:
    return quote(value, safe="")


# --- rotation -------------------------------------------------------------------


def credentials_rotate(*, batch_size: int = 200) -> int:
    """Re-encrypt every credential under the newest key; returns how many rows were rewritten.

    Each row is swapped only if its ciphertext is unchanged since it was read
    (a concurrent refresh or update already wrote it under the newest key).
    Rows no configured key can decrypt are left alone and reported at the end.
    """
    mf = fernet()
    rotated = 0
    undecryptable: list[int] = []
    per_workspace: dict[int, int] = {}
    last_pk = 0
    while True:
        batch = list(
            Credential.objects.filter(pk__gt=last_pk)
            .order_by("pk")
            .values_list("pk", "workspace_id", "encrypted_value")[:batch_size]
        )
        if not batch:
            break
        last_pk = batch[-1][0]
        with transaction.atomic():
            for pk, workspace_id, token in batch:
                try:
                    new_token = mf.rotate(token.encode()).decode()
                except InvalidToken:
                    undecryptable.append(pk)
                    continue
                if Credential.objects.filter(pk=pk, encrypted_value=token).update(encrypted_value=new_token):
                    rotated += 1
                    per_workspace[workspace_id] = per_workspace.get(workspace_id, 0) + 1
    with transaction.atomic():
        for workspace_id, count in sorted(per_workspace.items()):
            writer.append(
                trace_id=uuid.uuid4().hex, type="credentials.rotated", workspace_id=workspace_id,
                summary=f"{count} credential(s) re-encrypted under the newest key", stage="credentials",
                outcome=Outcome.SUCCESS, payload={"count": count},
            )  # fmt: skip
    if undecryptable:
        raise CredentialKeyError(
            f"{len(undecryptable)} credential(s) could not be decrypted with any configured key "
            f"(ids {', '.join(map(str, undecryptable[:20]))}); {rotated} rotated"
        )
    return rotated
