"""Strict JSON for every body the platform accepts (the API and webhooks).

Python's ``json`` accepts things a JSON store or a later read chokes on, so a body is
refused (:class:`BodyInvalid`, with a message safe to show the caller) unless it is:
UTF-8; plain JSON (no ``NaN``/``Infinity``); numbers finite, integers within 64 bits;
nested at most ``MAX_DEPTH`` levels (checked without recursing, and a parser that runs out
of stack is a refusal, not a crash); no duplicate keys in an object (last-one-wins hides
what the sender meant); and no NUL or lone surrogate in any string or key (PostgreSQL's
``jsonb`` cannot store them, and a value that cannot be written back as UTF-8 makes every
later read of the row fail).
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64
MAX_INT = 2**63 - 1
MIN_INT = -(2**63)


class BodyInvalid(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise BodyInvalid(f"{name} is not a JSON number")


def _parse_int(text: str) -> int:
    if len(text) > 20:
        raise BodyInvalid("integers must fit in 64 bits")
    value = int(text)
    if not MIN_INT <= value <= MAX_INT:
        raise BodyInvalid("integers must fit in 64 bits")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BodyInvalid("numbers must be finite")
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        raise BodyInvalid("an object has the same key twice")
    return value


def check_text(text: str) -> None:
    if "\x00" in text:
        raise BodyInvalid("strings must not contain U+0000")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BodyInvalid("strings must not contain lone surrogates") from None


def loads(raw: bytes | str, *, what: str = "the body") -> Any:
    """The JSON value of ``raw``, or BodyInvalid."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BodyInvalid(f"{what} is not UTF-8") from None
    try:
        value = json.loads(
            raw,
            object_pairs_hook=_object,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except BodyInvalid:
        raise
    except RecursionError:
        raise BodyInvalid(f"{what} is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError:  # JSONDecodeError, and int() past sys.int_max_str_digits
        raise BodyInvalid(f"{what} is not valid JSON") from None
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise BodyInvalid(f"{what} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            for key, item in node.items():
                check_text(key)
                stack.append((item, depth + 1))
        elif isinstance(node, list):
            stack.extend((item, depth + 1) for item in node)
        elif isinstance(node, str):
            check_text(node)
    return value
