"""Ed25519-signed approval tokens (SPEC §7.3). Pure apart from ``audit.signing``: no database.

A token is two base64url segments (no padding) joined by a dot::

    base64url(payload) "." base64url(Ed25519 signature over the payload bytes)

The payload is canonical JSON (keys sorted, no whitespace, UTF-8)::

    {"approval_id": "<uuid>", "exp": <unix seconds>, "kid": "<key id>",
     "kind": "autoplane.approval.token.v1", "nonce": "<random>",
     "plan_hash": "<sha256 hex>", "run_id": "<uuid>", "step_key": "<phase>:<index>:<step_id>", "v": 1}

``kind`` separates these signatures from anything else the platform key signs
(audit checkpoints carry another ``kind``), so neither can stand in for the
other. ``kid`` names the key that signed; only the current key authorises: a
token (or a standing approval) signed by a retired key is refused (``retired_key``),
retired keys verify old audit checkpoints and anchors only, and keys the platform
never had verify nothing. Verification checks, in order: shape, signature,
the ids the token is bound to, the plan hash, expiry. Consuming the nonce (so
a token works once) is the caller's job: it needs the database.

Standing approvals are signed here too (``standing_sign``/``standing_valid``)
over their bounds, with their own ``kind``.
"""

from __future__ import annotations

import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from audit import signing

TOKEN_KIND = "autoplane.approval.token.v1"  # noqa: S105 - a domain tag, not a secret
STANDING_KIND = "autoplane.approval.standing.v1"
TOKEN_VERSION = 1
MAX_TOKEN_LENGTH = 4096
_FIELDS = ("approval_id", "exp", "kid", "kind", "nonce", "plan_hash", "run_id", "step_key", "v")


class TokenInvalid(Exception):
    """The token must not authorise anything. ``reason`` is a stable code, safe to show and audit."""

    def __init__(self, reason: str, message: str = ""):
        super().__init__(message or reason)
        self.reason = reason
        self.message = message or reason


def _canonical(value: Mapping[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def mint(*, approval_id: str, run_id: str, step_key: str, plan_hash: str, nonce: str, exp: datetime) -> str:
    """Sign a token for one step of one run with the platform's current key."""
    kid = signing.current_key_id()
    payload = {
        "approval_id": str(approval_id),
        "exp": int(exp.timestamp()),
        "kid": kid,
        "kind": TOKEN_KIND,
        "nonce": str(nonce),
        "plan_hash": str(plan_hash),
        "run_id": str(run_id),
        "step_key": str(step_key),
        "v": TOKEN_VERSION,
    }
    data = _canonical(payload)
    signed_by, signature = signing.sign(data)
    if signed_by != kid:  # the key rotated between the two calls: sign again under the new id
        return mint(
            approval_id=approval_id,
            run_id=run_id,
            step_key=step_key,
            plan_hash=plan_hash,
            nonce=nonce,
            exp=exp,
        )
    return f"{signing.b64url(data)}.{signature}"


def decode(token: str) -> tuple[bytes, dict[str, Any], str]:
    """Split and parse a token without trusting it: (payload bytes, payload, signature)."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH or token.count(".") != 1:
        raise TokenInvalid("malformed", "the approval token is malformed")
    head, signature = token.split(".")
    try:
        data = signing.b64url_decode(head)
        payload = json.loads(data)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise TokenInvalid("malformed", "the approval token is malformed") from None
    if not isinstance(payload, dict) or sorted(payload) != sorted(_FIELDS):
        raise TokenInvalid("malformed", "the approval token is malformed")
    if payload["kind"] != TOKEN_KIND or payload["v"] != TOKEN_VERSION:
        raise TokenInvalid("malformed", "not an approval token of a version this platform accepts")
    if not isinstance(payload["exp"], int) or not all(
        isinstance(payload[name], str) for name in _FIELDS if name not in ("exp", "v")
    ):
        raise TokenInvalid("malformed", "the approval token is malformed")
    return data, payload, signature


def verify(
    token: str, *, approval_id: str, run_id: str, step_key: str, plan_hash: str, now: datetime
) -> dict[str, Any]:
    """The token's payload if it authorises exactly this step of this run's plan now; else TokenInvalid."""
    data, payload, signature = decode(token)
    known = {key["key_id"] for key in signing.public_keys()}
    if payload["kid"] not in known:
        raise TokenInvalid(
            "unknown_key", "the approval token was signed with a key this platform does not know"
        )
    if not signing.verify(payload["kid"], data, signature):
        raise TokenInvalid("bad_signature", "the approval token's signature is invalid")
    if not signing.is_current(payload["kid"]):
        raise TokenInvalid(
            "retired_key", "the approval token was signed with a retired key; ask for a new approval"
        )
    if payload["approval_id"] != str(approval_id):
        raise TokenInvalid("approval_mismatch", "the approval token belongs to another approval")
    if payload["run_id"] != str(run_id):
        raise TokenInvalid("run_mismatch", "the approval token belongs to another run")
    if payload["step_key"] != str(step_key):
        raise TokenInvalid("step_mismatch", "the approval token belongs to another step")
    if payload["plan_hash"] != str(plan_hash):
        raise TokenInvalid("plan_hash_mismatch", "what would run differs from what was approved")
    if now.timestamp() >= payload["exp"]:
        raise TokenInvalid("expired", "the approval token has expired")
    return payload


# --- standing approvals --------------------------------------------------------


def standing_bytes(
    *,
    standing_id: str,
    workspace_id: int,
    automation_id: str,
    capability_id: str,
    max_uses: int,
    expires_at: datetime,
    arg_constraint: Any,
    created_by: int | None,
    automation_version: int | None,
) -> bytes:
    return _canonical(
        {
            "arg_constraint": arg_constraint,
            "automation_id": str(automation_id),
            "automation_version": automation_version,
            "capability_id": str(capability_id),
            "created_by": created_by,
            "expires_at": int(expires_at.timestamp()),
            "id": str(standing_id),
            "kind": STANDING_KIND,
            "max_uses": int(max_uses),
            "workspace_id": int(workspace_id),
        }
    )


def standing_sign(**bounds: Any) -> tuple[str, str]:
    """(key id, signature) over a standing approval's bounds."""
    return signing.sign(standing_bytes(**bounds))


def standing_problem(key_id: str, signature: str, **bounds: Any) -> str | None:
    """None when the standing approval's signature covers its bounds and was made by the current key;
    else ``bad_signature`` or ``retired_key`` (a retired key authorises nothing new)."""
    if not key_id or not signature or not signing.verify(key_id, standing_bytes(**bounds), signature):
        return "bad_signature"
    if not signing.is_current(key_id):
        return "retired_key"
    return None


def standing_valid(key_id: str, signature: str, **bounds: Any) -> bool:
    return standing_problem(key_id, signature, **bounds) is None
