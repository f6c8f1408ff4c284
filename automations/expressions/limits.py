"""The limits every template is held to (SPEC §4), shared by the sandbox and its filters.

Pure module, no Django. The caps; the errors that report them (messages safe to show a user or
an LLM); the per-render budget of CPU time and bytes built, enforced by `tick` and `reserve`;
and the size-checked conversion of values to JSON and text that both rendering and the
filters go through. The sandbox (`template`) and the filters (`filters`) import this module;
it imports neither.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from contextvars import ContextVar
from datetime import date, datetime
from typing import Any

from jinja2.runtime import Undefined

MAX_SOURCE_BYTES = 8 * 1024
MAX_OUTPUT_BYTES = 1024 * 1024
RENDER_BUDGET_SECONDS = 0.1
# The budget is measured on the rendering thread's CPU clock, so a busy machine does not fail
# good templates; the wall clock is only a backstop.
WALL_BACKSTOP_SECONDS = 0.5
MAX_ALLOCATED_BYTES = 16 * MAX_OUTPUT_BYTES  # everything one render may build, all values together
MAX_INT_BITS = 4096
MAX_NESTING = 64
MAX_SLUG_INPUT = 10_000

OUTPUT_LIMIT_MESSAGE = "template output would exceed 1 MB"


class TemplateError(Exception):
    """A template that cannot be used; `message` is safe to show a user or an LLM."""

    code = "TEMPLATE_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TemplateLimitError(TemplateError):
    code = "TEMPLATE_LIMIT"


# -- budget ----------------------------------------------------------------------------------


class Budget:
    __slots__ = ("allocated", "cpu_deadline", "message", "ticks", "wall_deadline")

    def __init__(self, doing: str, seconds: float) -> None:
        self.cpu_deadline = time.thread_time() + seconds
        self.wall_deadline = time.monotonic() + seconds * WALL_BACKSTOP_SECONDS / RENDER_BUDGET_SECONDS
        self.message = f"template {doing} exceeded {seconds * 1000:.0f} ms"
        self.ticks = 0
        self.allocated = 0


CURRENT_BUDGET: ContextVar[Budget | None] = ContextVar("template_budget", default=None)


def tick() -> None:
    """One step of the current render (none outside one); stops it once its budget is spent."""
    budget = CURRENT_BUDGET.get()
    if budget is None:
        return
    budget.ticks += 1
    if budget.ticks & 7 == 0 and (
        time.thread_time() > budget.cpu_deadline or time.monotonic() > budget.wall_deadline
    ):
        raise TemplateLimitError(budget.message)


def reserve(size: int, *, single: bool = True) -> None:
    """Account for a value about to be built; refuse it before it is allocated. Every value
    counts towards the render's total; `single` ones must also fit the output cap."""
    if single and size > MAX_OUTPUT_BYTES:
        raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
    budget = CURRENT_BUDGET.get()
    if budget is not None:
        budget.allocated += size
        if budget.allocated > MAX_ALLOCATED_BYTES:
            raise TemplateLimitError("template built more than 16 MB of values")


# -- values ----------------------------------------------------------------------------------


def charge(value: Any, new_items: bool = False) -> None:
    """Count a value just derived from existing data (a slice, a method's or filter's result)
    against the render's total, so that repeating it cannot exhaust memory."""
    if isinstance(value, str):
        reserve(len(value), single=False)
    elif isinstance(value, list | tuple):
        per_item = 64 if new_items else 8
        reserve(
            sum(len(item) + per_item if isinstance(item, str) else per_item for item in value), single=False
        )


def check_text(text: str) -> int:
    """The UTF-8 size of text a template produced, which must be storable (PostgreSQL refuses NUL)."""
    if "\x00" in text:
        raise TemplateError("template produced a NUL character")
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise TemplateError("template produced invalid Unicode text") from None


def json_copy(value: Any, limit: int = MAX_OUTPUT_BYTES, indent: int = 0) -> tuple[Any, int]:
    """A JSON-safe copy of `value` (tuples become lists, dates ISO text) and its approximate JSON
    size; refuses it as soon as the size passes `limit`."""
    size = 0

    def key_text(key: Any) -> str:
        nonlocal size
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        elif not isinstance(key, str):
            raise TemplateError("template produced an object key that is not text")
        size += len(key) + 4
        return str(key)

    def copy(item: Any, depth: int) -> Any:
        nonlocal size
        size += 2 + depth * indent
        result: str | int | float | None  # a JSON scalar; bool is an int
        if isinstance(item, str):
            size += check_text(item)
            result = str(item)
        elif item is None or isinstance(item, bool):
            result = item
        elif isinstance(item, int):
            if item.bit_length() > MAX_INT_BITS:
                raise TemplateLimitError("number is too large")
            size += item.bit_length() // 3
            result = int(item)
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise TemplateError("template produced a number that is not finite")
            size += 22
            result = float(item)
        # builtin types first: isinstance against the ABCs is slower
        elif isinstance(item, dict | list | tuple | Mapping | KeysView | ValuesView | ItemsView):
            if depth >= MAX_NESTING:
                raise TemplateLimitError("value is nested too deeply")
            tick()
            if size > limit:
                raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
            if isinstance(item, Mapping):
                return {key_text(key): copy(child, depth + 1) for key, child in item.items()}
            return [copy(child, depth + 1) for child in item]
        elif isinstance(item, datetime | date):
            return copy(item.isoformat(), depth)
        elif isinstance(item, Undefined):
            item._fail_with_undefined_error()
        else:
            raise TemplateError("template produced a value that cannot be represented as JSON")
        if size > limit:
            raise TemplateLimitError(OUTPUT_LIMIT_MESSAGE)
        return result

    return copy(value, 0), size


def to_json(value: Any) -> Any:
    return json_copy(value)[0]


def json_text(value: Any, indent: int | None = None) -> str:
    plain = json_copy(value, indent=indent or 0)[0]
    if not isinstance(plain, dict | list):
        return json.dumps(plain)  # a scalar: the fast path
    text = json.dumps(plain, ensure_ascii=False, allow_nan=False, indent=indent)
    reserve(len(text))
    return text


def as_text(value: Any) -> str:
    """How a value reads inside text: strings as they are, everything else as JSON."""
    return value if isinstance(value, str) else json_text(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int)  # bool included, as Python does
