"""approvals.tokens without a database: minting, and every way a token is refused."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from approvals import tokens
from audit import signing

NOW = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)
BOUND = {
    "approval_id": "8d0f2a5e-0000-4000-8000-000000000001",
    "run_id": "8d0f2a5e-0000-4000-8000-0000000000aa",
    "step_key": "plan:1:delete_user",
    "plan_hash": "a" * 64,
}


def _mint(**overrides) -> str:
    fields = {**BOUND, "nonce": "n-1", "exp": NOW + timedelta(minutes=5), **overrides}
    return tokens.mint(**fields)


def _verify(token: str, now: datetime = NOW, **overrides):
    return tokens.verify(token, **{**BOUND, **overrides}, now=now)


def _forge(payload: dict, key: Ed25519PrivateKey) -> str:
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    return f"{signing.b64url(data)}.{signing.b64url(key.sign(data))}"


def _payload(token: str) -> dict:
    return json.loads(signing.b64url_decode(token.split(".")[0]))


def test_minted_token_verifies_and_carries_its_bindings():
    token = _mint()

    payload = _verify(token)

    assert payload == {**BOUND, "nonce": "n-1", "exp": int((NOW + timedelta(minutes=5)).timestamp()),
                       "kid": signing.current_key_id(), "kind": tokens.TOKEN_KIND, "v": 1}  # fmt: skip
    assert token.count(".") == 1
    assert "=" not in token


@pytest.mark.parametrize(
    ("override", "reason"),
    [
        ({"approval_id": "8d0f2a5e-0000-4000-8000-000000000002"}, "approval_mismatch"),
        ({"run_id": "8d0f2a5e-0000-4000-8000-0000000000bb"}, "run_mismatch"),
        ({"step_key": "plan:2:delete_user"}, "step_mismatch"),
        ({"plan_hash": "b" * 64}, "plan_hash_mismatch"),
    ],
)
def test_token_used_for_something_else_is_refused(override, reason):
    token = _mint()

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(token, **override)

    assert refused.value.reason == reason


def test_expired_token_is_refused():
    token = _mint(exp=NOW)

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(token, now=NOW + timedelta(seconds=1))

    assert refused.value.reason == "expired"


def test_token_signed_with_another_key_under_our_key_id_is_refused():
    payload = _payload(_mint())

    forged = _forge(payload, Ed25519PrivateKey.generate())

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(forged)
    assert refused.value.reason == "bad_signature"


def test_token_signed_with_an_unknown_key_is_refused():
    other = Ed25519PrivateKey.generate()
    payload = {**_payload(_mint()), "kid": signing.key_id_for(other.public_key())}

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(_forge(payload, other))
    assert refused.value.reason == "unknown_key"


def test_edited_payload_breaks_the_signature():
    token = _mint()
    payload = {**_payload(token), "plan_hash": "c" * 64}
    data = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    tampered = f"{signing.b64url(data)}.{token.split('.')[1]}"

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(tampered, plan_hash="c" * 64)
    assert refused.value.reason == "bad_signature"


@pytest.mark.parametrize("garbage", ["", "x", "a.b.c", "!!!.???", "e30.sig", "approved", None, "a" * 5000])
def test_garbage_is_malformed(garbage):
    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(garbage)
    assert refused.value.reason == "malformed"


def test_another_kind_of_signed_statement_is_not_a_token():
    """An audit checkpoint signature (same key, other ``kind``) cannot pass as an approval token."""
    from audit.checkpoints import checkpoint_bytes

    data = checkpoint_bytes(
        chain="ws-1", seq=3, head_hash="d" * 64, created_at="2030-01-01T00:00:00.000000+00:00"
    )
    _, signature = signing.sign(data)

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(f"{signing.b64url(data)}.{signature}")
    assert refused.value.reason == "malformed"


def test_token_from_a_retired_key_is_refused_though_the_key_still_verifies_old_signatures(settings, tmp_path):
    """A retired key proves what it signed before the rotation (checkpoints, anchors); it authorises
    nothing: an approval token it signed is refused (issue 29)."""
    token = _mint()
    checkpoint_key, checkpoint = signing.sign(b"checkpoint")
    old_public = signing.signing_key().public_key()
    retired = tmp_path / "retired.pem"
    retired.write_text(signing.public_pem(old_public))
    new_file = tmp_path / "new" / "signing_key.pem"
    signing.generate_key_file(new_file)
    settings.AUTOPLANE_SIGNING_KEY_FILE = new_file
    settings.AUTOPLANE_RETIRED_PUBLIC_KEY_FILES = [retired]

    with pytest.raises(tokens.TokenInvalid) as refused:
        _verify(token)
    assert refused.value.reason == "retired_key"
    assert signing.current_key_id() != signing.key_id_for(old_public)
    assert signing.verify(checkpoint_key, b"checkpoint", checkpoint)


def test_standing_signature_covers_every_bound():
    bounds = {
        "standing_id": "s-1", "workspace_id": 1, "automation_id": "a-1", "capability_id": "http_request",
        "max_uses": 3, "expires_at": NOW, "arg_constraint": {"type": "object"}, "created_by": 7,
        "automation_version": 4,
    }  # fmt: skip
    key_id, signature = tokens.standing_sign(**bounds)

    assert tokens.standing_valid(key_id, signature, **bounds)
    for name, value in [("max_uses", 300), ("expires_at", NOW + timedelta(days=1)), ("arg_constraint", None),
                        ("capability_id", "send_email"), ("automation_id", "a-2"), ("workspace_id", 2),
                        ("automation_version", 5), ("automation_version", None)]:  # fmt: skip
        assert not tokens.standing_valid(key_id, signature, **{**bounds, name: value}), name
    assert not tokens.standing_valid("", "", **bounds)
