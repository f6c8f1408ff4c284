"""Redaction catches a secret's common encodings too (issue 12, finding 3). No database."""

from __future__ import annotations

import base64
from urllib.parse import quote, quote_plus

import pytest

from audit.redaction import REDACTED, redact

SECRET = "s3cr3t/t0ken+value"


@pytest.mark.parametrize(
    "leaked",
    [
        SECRET,
        quote(SECRET, safe=""),
        quote_plus("x " + SECRET),
        SECRET.encode().hex(),
        SECRET.encode().hex().upper(),
        *(
            base64.b64encode((prefix + SECRET + suffix).encode()).decode()
            for prefix in ("", "a", "ab", "Bearer ")
            for suffix in ("", "z", "yz")
        ),  # fmt: skip
        *(
            base64.urlsafe_b64encode((prefix + SECRET).encode()).decode().rstrip("=")
            for prefix in ("", "a", "ab")
        ),
    ],
)
def test_the_secret_and_its_encodings_are_redacted(leaked: str) -> None:
    redacted = redact({"out": f"before {leaked} after"}, [SECRET])["out"]
    assert REDACTED in redacted
    assert leaked not in redacted


def test_ordinary_text_is_left_alone() -> None:
    text = "plain words, 0123456789abcdef and aGVsbG8gd29ybGQ="
    assert redact(text, [SECRET]) == text


@pytest.mark.parametrize("secret", ["7", "ab", "x9!", "é"])
def test_a_short_secret_is_redacted_where_a_whole_value_is_it(secret: str) -> None:
    raw = secret.encode()
    data = {"pin": secret, "list": [secret, quote(secret, safe=""), raw.hex(), base64.b64encode(raw).decode()],
            secret: "as a key"}  # fmt: skip

    redacted = redact(data, [secret])

    assert redacted["pin"] == REDACTED
    assert redacted["list"] == [REDACTED] * 4
    assert REDACTED in redacted  # the key


@pytest.mark.parametrize("secret", ["7", "ab", "x9!"])
def test_a_short_secret_inside_longer_text_is_left_alone(secret: str) -> None:
    text = f"order {secret}7 of 2024, abc x9!z"
    assert redact({"t": text}, [secret]) == {"t": text}


def test_an_empty_secret_redacts_nothing() -> None:
    assert redact({"a": "", "b": "x"}, [""]) == {"a": "", "b": "x"}
