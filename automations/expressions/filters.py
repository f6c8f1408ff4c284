"""The curated Jinja filters and tests a template may use (SPEC §4).

Pure module, no Django. Every filter ticks the render budget and refuses a result that would
pass the output cap before building it (see `limits`). The sandbox (`template`) installs
`FILTERS` and `TESTS` in its environment and refuses, at save time, any filter or test whose
name is not in `ALLOWED_FILTERS` or `ALLOWED_TESTS`.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from datetime import UTC, date, datetime
from typing import Any

from jinja2 import Environment, pass_context
from jinja2.runtime import Undefined
from jinja2.tests import TESTS as JINJA_TESTS

from .limits import (
    MAX_OUTPUT_BYTES,
    MAX_SLUG_INPUT,
    OUTPUT_LIMIT_MESSAGE,
    TemplateError,
    TemplateLimitError,
    as_text,
    charge,
    is_int,
    json_text,
    reserve,
    tick,
)


def _filter(
    func: Any, accepts_undefined: bool = False, builds: bool = False, environment: bool = False
) -> Any:
    # Filters take the context only so that Jinja never runs them while compiling (constant
    # folding), where no budget applies. `environment` filters get the sandbox's environment
    # first, for its guarded item lookup and its undefined type.
    @pass_context
    @functools.wraps(func)
    def run(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        tick()
        if isinstance(value, Undefined) and not accepts_undefined:
            value._fail_with_undefined_error()
        if environment:
            result = func(context.environment, value, *args, **kwargs)
        else:
            result = func(value, *args, **kwargs)
        if builds:
            charge(result)
        return result

    return run


def _default(value: Any, default_value: Any = "", boolean: bool = False) -> Any:
    return default_value if isinstance(value, Undefined) or (boolean and not value) else value


def _join(value: Any, separator: Any = "") -> str:
    separator = as_text(separator)
    parts, size = [], 0
    for item in value:
        tick()
        part = as_text(item)
        size += len(part) + len(separator)
        if size > MAX_OUTPUT_BYTES:
            raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
        parts.append(part)
    reserve(size)
    return separator.join(parts)


def _truncate(
    value: Any, length: int = 255, killwords: bool = False, end: str = "...", leeway: int = 5
) -> str:
    text, end = as_text(value), as_text(end)
    if length < len(end) or leeway < 0:
        raise TemplateError("truncate: length must be at least the length of the end marker")
    if len(text) <= length + leeway:
        return text
    cut = text[: length - len(end)]
    return (cut if killwords else cut.rsplit(" ", 1)[0]) + end


def _tojson(value: Any, indent: int | None = None) -> str:
    if indent is not None and not (is_int(indent) and 0 <= indent <= 8):
        raise TemplateError("tojson: indent must be between 0 and 8")
    return json_text(value, indent)


_DATE_FORMAT = re.compile(r"(?:[^%]|%[aAbBcdfGHIjmMpSuUVwWxXyYzZ%])*")


def _date(value: Any, format: str = "%Y-%m-%d") -> str:
    try:
        if isinstance(value, str) and len(value) <= 64:
            value = datetime.fromisoformat(value.strip())
        elif isinstance(value, int | float) and not isinstance(value, bool):
            value = datetime.fromtimestamp(value, tz=UTC)
    except (ValueError, OverflowError, OSError):
        value = None
    if not isinstance(value, date):
        raise TemplateError("date: expected a date, a datetime, ISO 8601 text or a Unix timestamp")
    if not isinstance(format, str) or len(format) > 64 or not _DATE_FORMAT.fullmatch(format):
        raise TemplateError("date: the format may use only plain strftime codes like %Y-%m-%d %H:%M")
    return value.strftime(format)


def _replace(value: Any, old: Any, new: Any, count: int | None = None) -> str:
    text, old, new = as_text(value), as_text(old), as_text(new)
    if count is not None and not is_int(count):
        raise TemplateError("replace: count must be a number")
    hits = len(text) + 1 if not old else text.count(old)
    if count is not None and count >= 0:
        hits = min(hits, count)
    reserve(len(text) + hits * max(len(new) - len(old), 0))
    return text.replace(old, new, -1 if count is None else count)


_SLUG_JUNK = re.compile(r"[^a-z0-9]+")


def _slugify(value: Any) -> str:
    text = as_text(value)
    if len(text) > MAX_SLUG_INPUT:
        raise TemplateLimitError(f"slugify: text is longer than {MAX_SLUG_INPUT} characters")
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    return _SLUG_JUNK.sub("-", text.lower()).strip("-")


def _first(environment: Environment, value: Any) -> Any:
    for item in value:
        return item
    return environment.undefined(hint="first: the sequence is empty")


def _last(environment: Environment, value: Any) -> Any:
    for item in reversed(value):
        return item
    return environment.undefined(hint="last: the sequence is empty")


def _sort(
    environment: Environment,
    value: Any,
    reverse: bool = False,
    case_sensitive: bool = False,
    attribute: Any = None,
) -> list:
    path = () if attribute is None else str(attribute).split(".")

    def key(item: Any) -> Any:
        tick()
        for part in path:
            item = environment.getitem(item, int(part) if part.isdigit() else part)
        return item if case_sensitive or not isinstance(item, str) else item.lower()

    items = list(value)
    try:
        return sorted(items, key=key, reverse=bool(reverse))
    except TypeError:
        raise TemplateError("sort: these values cannot be compared with each other") from None


def _reverse(value: Any) -> Any:
    return value[::-1] if isinstance(value, str) else list(value)[::-1]


def _round(value: Any, precision: int = 0, method: str = "common") -> Any:
    if not is_int(precision) or abs(precision) > 20 or method not in ("common", "ceil", "floor"):
        raise TemplateError("round: precision must be -20..20 and method common, ceil or floor")
    if method == "common":
        return round(value, precision)
    return (math.ceil if method == "ceil" else math.floor)(value * 10**precision) / 10**precision


def _int(value: Any, default: Any = 0, base: int = 10) -> Any:
    if isinstance(value, str) and len(value) > 100:
        return default
    try:
        return int(value, base) if isinstance(value, str) else int(value)
    except (TypeError, ValueError, OverflowError):
        try:
            return int(float(value))
        except (TypeError, ValueError, OverflowError):
            return default


def _float(value: Any, default: Any = 0.0) -> Any:
    if isinstance(value, str) and len(value) > 100:
        return default
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return default


FILTERS = {
    "join": _filter(_join),
    "length": _filter(len),
    "default": _filter(_default, accepts_undefined=True),
    "d": _filter(_default, accepts_undefined=True),
    "upper": _filter(lambda value: as_text(value).upper(), builds=True),
    "lower": _filter(lambda value: as_text(value).lower(), builds=True),
    "trim": _filter(
        lambda value, chars=None: as_text(value).strip(None if chars is None else as_text(chars)), builds=True
    ),
    "truncate": _filter(_truncate, builds=True),
    "tojson": _filter(_tojson),
    "date": _filter(_date),
    "replace": _filter(_replace),
    "slugify": _filter(_slugify, builds=True),
    "first": _filter(_first, environment=True),
    "last": _filter(_last, environment=True),
    "sort": _filter(_sort, builds=True, environment=True),
    "reverse": _filter(_reverse, builds=True),
    "abs": _filter(abs),
    "round": _filter(_round),
    "int": _filter(_int),
    "float": _filter(_float),
    "string": _filter(as_text),
}
ALLOWED_FILTERS: frozenset[str] = frozenset(FILTERS)
ALLOWED_TESTS: frozenset[str] = frozenset(
    {"defined", "none", "number", "string", "mapping", "sequence", "boolean"}
)
TESTS = {name: JINJA_TESTS[name] for name in ALLOWED_TESTS}
