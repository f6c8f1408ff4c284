"""Replacing secret values wherever they appear in JSON-like data.

Besides the literal value, the forms a secret commonly takes on its way through an HTTP
echo or a log line are replaced too: URL-encoded (``quote`` and ``quote_plus``), hex
(lower and upper case), and base64 (standard and URL-safe alphabets), the latter at
each of the three byte alignments the secret can have inside a longer encoded text, so
``base64(prefix + secret + suffix)`` is caught as well as ``base64(secret)``.

Secrets shorter than 4 characters (a PIN, a one-letter password) are redacted too, but only
where a whole string *is* the secret or one of those encodings of it: as a substring they
would redact ordinary words and numbers everywhere, so ``"pin: 42"`` keeps its ``42`` while
a value ``"42"`` becomes ``[REDACTED]``.

What this cannot catch: any other transformation (reversed, split, XORed, compressed,
encrypted, one character per line...). Code that receives a secret can always leak it;
that is why credentials reach code steps only when their grant allows it
(``capabilities.grants``), and redaction is a last line of defence, not the control.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from functools import lru_cache
from typing import Any
from urllib.parse import quote, quote_plus

REDACTED = "[REDACTED]"
_MIN_SECRET_LENGTH = 4  # a shorter secret is redacted as a whole value only (it would redact ordinary words)
_MIN_ENCODED_LENGTH = 6  # a shorter fragment of an encoding is likely to occur by chance


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """Return ``value`` with every occurrence of every secret (and its encodings) replaced by ``[REDACTED]``."""
    forms: set[str] = set()
    whole: set[str] = set()
    for secret in secrets:
        if not secret:
            continue
        if len(secret) >= _MIN_SECRET_LENGTH:
            forms.update(encoded_forms(secret))
        else:
            whole.update(_whole_forms(secret))
    needles = sorted(forms, key=len, reverse=True)
    if not needles and not whole:
        return value
    return _redact(value, needles, frozenset(whole))


def _whole_forms(secret: str) -> set[str]:
    """A short secret and its whole encodings: matched only as an entire string."""
    raw = secret.encode("utf-8", "surrogatepass")
    encoded = base64.b64encode(raw).decode()
    return {secret, quote(secret, safe=""), quote_plus(secret, safe=""), raw.hex(), raw.hex().upper(),
            encoded, encoded.translate(_URLSAFE)}  # fmt: skip


@lru_cache(maxsize=1024)
def encoded_forms(secret: str) -> frozenset[str]:
    """The secret and the encodings of it that redaction looks for."""
    raw = secret.encode("utf-8", "surrogatepass")
    forms = {secret, quote(secret, safe=""), quote_plus(secret, safe=""), raw.hex(), raw.hex().upper()}
    for shift in range(3):  # the secret's byte offset modulo 3 inside a longer base64 text
        encoded = base64.b64encode(b"\0" * shift + raw + b"\0\0").decode()
        # only the characters whose 6 bits all come from the secret are the same in any text
        core = encoded[-(-8 * shift // 6) : (8 * (shift + len(raw))) // 6]
        forms.update((core, core.translate(_URLSAFE)))
        if shift == 0:  # the whole value encoded on its own, padding included
            whole = base64.b64encode(raw).decode()
            forms.update((whole, whole.translate(_URLSAFE)))
    return frozenset(f for f in forms if f == secret or len(f) >= _MIN_ENCODED_LENGTH)


_URLSAFE = str.maketrans("+/", "-_")


def _redact(value: Any, needles: list[str], whole: frozenset[str] = frozenset()) -> Any:
    if isinstance(value, str):
        if value in whole:
            return REDACTED
        for needle in needles:
            if needle in value:
                value = value.replace(needle, REDACTED)
        return value
    if isinstance(value, dict):
        return {_redact(k, needles, whole): _redact(v, needles, whole) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v, needles, whole) for v in value]
    return value


__all__ = ["REDACTED", "encoded_forms", "redact"]
