"""Replacing secret values wherever they appear in JSON-like data."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

REDACTED = "[REDACTED]"
_MIN_SECRET_LENGTH = 4  # shorter "secrets" would redact ordinary words


def redact(value: Any, secrets: Iterable[str]) -> Any:
    """Return ``value`` with every occurrence of every secret replaced by ``[REDACTED]``."""
    needles = sorted({s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True)
    if not needles:
        return value
    return _redact(value, needles)


def _redact(value: Any, needles: list[str]) -> Any:
    if isinstance(value, str):
        for needle in needles:
            if needle in value:
                value = value.replace(needle, REDACTED)
        return value
    if isinstance(value, dict):
        return {_redact(k, needles): _redact(v, needles) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redact(v, needles) for v in value]
    return value
