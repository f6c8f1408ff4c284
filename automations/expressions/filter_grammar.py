"""The domain-event filter grammar (SPEC §6.3): validation and evaluation. Pure: no Django.

A filter is a condition or a composition of filters::

    {"path": "payload.size", "gt": 0}
    {"$and": [filter, ...]}    {"$or": [filter, ...]}    {"$not": filter}

A condition holds a ``path`` and exactly one operator. The path is dotted and is
read from the event document (``{"event_type", "source", "payload", ...}``): each
segment selects an object key or, when it is a decimal integer, a list index
(``payload.items.0.name``). ``$and`` and ``$or`` need at least one member: an empty
one is far more likely a mistake than a deliberate "always" or "never".

Semantics, on JSON values (``true`` is not ``1``, although it is in Python):

- a path that does not resolve makes every operator false except ``exists: false``
  and ``not_equals`` (``not_in`` included: it asks about a value that is there);
- ``equals`` / ``not_equals``: deep JSON equality (``1 == 1.0``; ``null`` equals only a
  present ``null``); ``in`` / ``not_in``: the value equals one / none of the listed values;
- ``gt gte lt lte``: number against number or string against string (code-point
  order); any other pairing is false;
- ``starts_with ends_with``: string values only; ``contains``: a substring of a string
  value or a member (deep equality) of a list value; ``regex``: RE2 syntax, searched
  unanchored in a string value (anchor with ``^``/``$``);
- ``exists: true``: the path resolves (to anything, ``null`` included).

A type mismatch makes an operator false, so ``not_equals`` and ``not_in`` are true on it.

Limits, checked by :func:`validate_filter`, each with its own error code: at most
``MAX_DEPTH`` levels of nesting (a bare condition is one level; ``filter_too_deep``), at
most ``MAX_CONDITIONS`` conditions (``filter_too_large``), ``in``/``not_in`` lists of at
most ``MAX_LIST_LENGTH`` values (``list_too_long``), and regexes that RE2 compiles (no
backreferences, no lookaround; ``invalid_regex``) within ``MAX_REGEX_LENGTH`` characters
and, all the filter's regexes together, ``MAX_REGEX_PROGRAM_SIZE`` compiled instructions
(``regex_too_complex``).

Evaluation cost. RE2 runs in time linear in the subject and in the program size, but
the constant is large when the DFA cannot cache its states (a pattern like
``[ab]*a[ab]{30}c`` on random text builds a new state per byte): measured at up to
~25 ns per instruction per subject byte. Native calls cannot be interrupted, so the work
is bounded before the call: the regexes of a filter search at most ``MAX_REGEX_WORK``
instruction-bytes per event, i.e. each regex searches strings of at most
``MAX_REGEX_WORK // (the filter's total program size)`` UTF-8 bytes (from ~800 bytes for the
largest accepted filter to 64 KB for a small pattern). String ``contains`` (a linear
scan in C) searches up to ``MAX_SUBJECT_LENGTH`` characters. Longer strings are left
unsearched: the condition is false. Each evaluation has a budget of ``EVAL_BUDGET_SECONDS`` of CPU
time (the thread's, so a busy machine preempting the worker does not count against the
filter), checked before every condition, within long list scans and at the end; running
past it raises :class:`FilterBudgetExceeded` instead of answering, so the caller can audit
a filter that is too expensive rather than silently dropping or matching the event.
"""

from __future__ import annotations

import copy
import operator
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

MAX_DEPTH = 8
MAX_CONDITIONS = 64
EVAL_BUDGET_SECONDS = 0.010
MAX_REGEX_LENGTH = 256
# RE2 is linear, but its worst case (a DFA that keeps growing, like "[ab]*a[ab]{200}c",
# compiled afresh) costs ~25 ns per compiled instruction per subject byte; typical patterns
# take microseconds. Unicode classes are big: "\pL" alone is 1201 instructions. The
# program size is summed over the filter's regexes, since each one runs on every event.
MAX_REGEX_PROGRAM_SIZE = 300  # a literal of MAX_REGEX_LENGTH characters is 260
# Instruction-bytes the regexes of one filter may search per event: 250,000 x 25 ns is
# ~6 ms, inside the 10 ms budget, for the worst filter accepted (bench: filter_worst_case).
MAX_REGEX_WORK = 250_000
MAX_SUBJECT_LENGTH = 65_536
MAX_LIST_LENGTH = 256

OPERATORS = "equals not_equals starts_with ends_with contains regex gt gte lt lte in not_in exists".split()
_ORDERINGS: dict[str, Callable[[Any, Any], bool]] = {
    "gt": operator.gt,
    "gte": operator.ge,
    "lt": operator.lt,
    "lte": operator.le,
}
_ORDERED_VALUE = {"type": ["number", "string"], "description": "compared number to number, string to string"}


def _composition(key: str, members: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "description": description,
        "properties": {key: members},
        "required": [key],
        "additionalProperties": False,
    }


_FILTERS = {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/filter"}}


FILTER_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://autoplane.dev/schema/filter.json",
    "title": "autoplane domain-event filter",
    "description": f"At most {MAX_DEPTH} levels deep and {MAX_CONDITIONS} conditions.",
    "$ref": "#/$defs/filter",
    "$defs": {
        # Dispatch on the key present rather than `oneOf`, so a mistake is reported
        # where it is instead of as "not valid under any of the given schemas".
        "filter": {
            "type": "object",
            "if": {"required": ["$and"]},
            "then": {"$ref": "#/$defs/and"},
            "else": {
                "if": {"required": ["$or"]},
                "then": {"$ref": "#/$defs/or"},
                "else": {
                    "if": {"required": ["$not"]},
                    "then": {"$ref": "#/$defs/not"},
                    "else": {"$ref": "#/$defs/condition"},
                },
            },
        },
        "and": _composition("$and", _FILTERS, "true when every member is true"),
        "or": _composition("$or", _FILTERS, "true when any member is true"),
        "not": _composition("$not", {"$ref": "#/$defs/filter"}, "true when the member is false"),
        "condition": {
            "type": "object",
            "description": "a path and exactly one operator",
            "required": ["path"],
            "minProperties": 2,
            "maxProperties": 2,
            "additionalProperties": False,
            "properties": {
                "path": {"type": "string", "maxLength": 256, "pattern": r"^[^.]+(\.[^.]+)*$"},
                "equals": {"description": "any JSON value"},
                "not_equals": {"description": "any JSON value"},
                "starts_with": {"type": "string"},
                "ends_with": {"type": "string"},
                "contains": {"description": "a substring, or a list member"},
                "regex": {"type": "string", "maxLength": MAX_REGEX_LENGTH, "description": "RE2 syntax"},
                "gt": _ORDERED_VALUE,
                "gte": _ORDERED_VALUE,
                "lt": _ORDERED_VALUE,
                "lte": _ORDERED_VALUE,
                "in": {"type": "array", "maxItems": MAX_LIST_LENGTH},
                "not_in": {"type": "array", "maxItems": MAX_LIST_LENGTH},
                "exists": {"type": "boolean"},
            },
        },
    },
}
_VALIDATOR = Draft202012Validator(FILTER_SCHEMA)

_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.never_capture = True  # only yes/no is asked: RE2 can stay in its DFA
_RE2_OPTIONS.log_errors = False  # a bad pattern is reported as an issue, not on stderr


@dataclass(frozen=True)
class FilterIssue:
    path: str  # JSON pointer into the filter, "" for the filter itself
    # invalid_filter | filter_too_deep | filter_too_large | list_too_long | invalid_regex
    # | regex_too_complex
    code: str
    message: str


class FilterError(Exception):
    def __init__(self, issues: list[FilterIssue]) -> None:
        super().__init__(issues)
        self.issues = issues

    def __str__(self) -> str:
        return "; ".join(f"{issue.path or '/'}: {issue.message}" for issue in self.issues)


class FilterBudgetExceeded(FilterError):
    """An evaluation used up its CPU-time budget, so the event got no answer."""

    def __init__(self, budget_seconds: float) -> None:
        message = f"evaluation used more than {budget_seconds * 1000:g} ms of CPU time"
        super().__init__([FilterIssue("", "filter_budget_exceeded", message)])
        self.args = (budget_seconds,)  # so that it unpickles
        self.budget_seconds = budget_seconds


def validate_filter(filter: Any) -> list[FilterIssue]:
    """Every problem with `filter`; an empty list means it compiles."""
    # Limits first, walking iteratively: the schema validator recurses, and a hostile
    # filter must not get to make it recurse a thousand levels deep.
    issues = _limit_issues(filter)
    if issues:
        return issues
    errors = sorted(_VALIDATOR.iter_errors(filter), key=lambda error: _pointer(error.absolute_path))
    if errors:  # deduplicated: a non-object fails "type" at two levels of the schema
        return list(dict.fromkeys(_schema_issue(error) for error in errors))
    total = 0
    for pointer, condition in _conditions(filter, ""):
        if "regex" in condition:
            try:
                total += _program_size(_compile_regex(condition["regex"]))
            except ValueError as exc:
                issues.append(FilterIssue(f"{pointer}/regex", "invalid_regex", str(exc)))
                continue
            if total > MAX_REGEX_PROGRAM_SIZE:
                message = (
                    f"regexes too complex: {total} instructions compiled so far, "
                    f"at most {MAX_REGEX_PROGRAM_SIZE} for all the filter's regexes together"
                )
                issues.append(FilterIssue(f"{pointer}/regex", "regex_too_complex", message))
                break
    return issues


def compile_filter(filter: Any) -> CompiledFilter:
    """The filter ready to evaluate; raises FilterError when it is invalid."""
    filter = copy.deepcopy(filter)  # later changes to the caller's dict must not leak in
    issues = validate_filter(filter)
    if issues:
        raise FilterError(issues)
    return CompiledFilter(_build(filter))


class CompiledFilter:
    """A valid filter, immutable and safe to share between threads."""

    __slots__ = ("_root",)

    def __init__(self, root: _Node) -> None:
        self._root = root

    @property
    def regex_subject_limit(self) -> int:
        """The longest string (UTF-8 bytes) this filter's regexes search."""
        return _regex_subject_limit(self._root)

    def matches(self, document: Mapping[str, Any], *, budget_seconds: float = EVAL_BUDGET_SECONDS) -> bool:
        """Whether the event document passes; raises FilterBudgetExceeded past the CPU budget."""
        budget = _Budget(budget_seconds, time.thread_time() + budget_seconds)
        result = self._root.evaluate(document, budget)
        budget.check()  # the last condition may have overrun too
        return result


# --- validation -------------------------------------------------------------------


def _limit_issues(filter: Any) -> list[FilterIssue]:
    conditions = 0
    stack: list[tuple[Any, str, int]] = [(filter, "", 1)]
    while stack:
        node, pointer, depth = stack.pop()
        if not isinstance(node, dict):
            continue  # the schema reports it
        if depth > MAX_DEPTH:
            message = f"filters nest at most {MAX_DEPTH} levels deep (a condition is one level)"
            return [FilterIssue(pointer, "filter_too_deep", message)]
        if "$not" in node:
            stack.append((node["$not"], f"{pointer}/$not", depth + 1))
        for key in ("$and", "$or"):
            if isinstance(node.get(key), list):
                stack.extend(
                    (member, f"{pointer}/{key}/{i}", depth + 1) for i, member in enumerate(node[key])
                )
        if not node.keys() & {"$and", "$or", "$not"}:
            conditions += 1
            if conditions > MAX_CONDITIONS:
                return [
                    FilterIssue("", "filter_too_large", f"a filter has at most {MAX_CONDITIONS} conditions")
                ]
    return []


def _schema_issue(error: ValidationError) -> FilterIssue:
    pointer = _pointer(error.absolute_path)
    message = error.message
    if error.validator in ("minProperties", "maxProperties"):  # only conditions bound their size
        message = f"a condition has a path and exactly one operator, one of: {', '.join(OPERATORS)}"
    elif error.validator == "maxLength":  # rather than echo the long string back
        message = f"longer than {error.validator_value} characters"
    last = error.absolute_path[-1] if error.absolute_path else None
    if error.validator == "maxItems" and last in ("in", "not_in"):
        message = f"an {last} list has at most {error.validator_value} values"
        return FilterIssue(pointer, "list_too_long", message)
    return FilterIssue(pointer, "invalid_regex" if last == "regex" else "invalid_filter", message)


def _pointer(parts: Iterable[str | int]) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in parts)


def _conditions(node: Mapping[str, Any], pointer: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The conditions of a schema-valid filter, with their JSON pointers."""
    if "$not" in node:
        yield from _conditions(node["$not"], f"{pointer}/$not")
    elif "$and" in node or "$or" in node:
        key = "$and" if "$and" in node else "$or"
        for i, member in enumerate(node[key]):
            yield from _conditions(member, f"{pointer}/{key}/{i}")
    else:
        yield pointer, node


def _compile_regex(pattern: str) -> Any:
    try:
        regex = re2.compile(pattern, _RE2_OPTIONS)
    except (re2.error, UnicodeError) as exc:
        detail = exc.args[0] if exc.args else exc
        detail = detail.decode(errors="replace") if isinstance(detail, bytes) else str(detail)
        raise ValueError(
            f"not a regex RE2 accepts ({detail}); RE2 runs in linear time, so it has no "
            "backreferences and no lookaround"
        ) from None
    return regex


def _program_size(regex: Any) -> int:
    # ProgramSize is not wrapped by the Python API; a google-re2 upgrade that moves it fails the tests.
    return int(regex._regexp.ProgramSize())


# --- evaluation -------------------------------------------------------------------

_MISSING: Any = object()


@dataclass(frozen=True)
class _Budget:
    seconds: float
    deadline: float

    def check(self) -> None:
        if time.thread_time() > self.deadline:
            raise FilterBudgetExceeded(self.seconds)


@dataclass(frozen=True)
class _Condition:
    path: tuple[tuple[str, int | None], ...]  # (key, the key as a list index if it is one)
    op: str
    value: Any
    regex: Any = None
    subject_limit: int = MAX_SUBJECT_LENGTH  # for a regex: bytes, shared out by MAX_REGEX_WORK
    # for in/not_in: the listed strings and numbers as a set, the other values to scan
    scalars: frozenset[Any] = frozenset()
    others: tuple[Any, ...] = ()

    def evaluate(self, document: Any, budget: _Budget) -> bool:
        budget.check()
        actual = document
        for key, index in self.path:
            if isinstance(actual, Mapping) and key in actual:
                actual = actual[key]
            elif isinstance(actual, list) and index is not None and index < len(actual):
                actual = actual[index]
            else:
                return self.op == "not_equals" or (self.op == "exists" and self.value is False)
        return self._test(actual, budget)

    def _test(self, actual: Any, budget: _Budget) -> bool:
        op, value = self.op, self.value
        match op:
            case "exists":
                return bool(value)
            case "equals" | "not_equals":
                return _json_equal(actual, value) == (op == "equals")
            case "in" | "not_in":
                if _is_scalar(actual):
                    found = actual in self.scalars
                else:
                    found = _has_member(self.others, actual, budget)
                return found == (op == "in")
            case "gt" | "gte" | "lt" | "lte":
                comparable = (isinstance(actual, str) and isinstance(value, str)) or (
                    _is_number(actual) and _is_number(value)
                )
                return comparable and _ORDERINGS[op](actual, value)
            case "contains" if isinstance(actual, list):
                return _has_member(actual, value, budget)
            case "contains":
                return (
                    isinstance(actual, str)
                    and isinstance(value, str)
                    and _searchable(actual)
                    and value in actual
                )
            case "starts_with":
                return isinstance(actual, str) and actual.startswith(value)
            case "ends_with":
                return isinstance(actual, str) and actual.endswith(value)
            case "regex" if isinstance(actual, str) and len(actual) <= self.subject_limit:
                data = actual.encode("utf-8", "surrogatepass")
                return len(data) <= self.subject_limit and self.regex.search(data) is not None
        return False


@dataclass(frozen=True)
class _All:
    members: tuple[_Node, ...]

    def evaluate(self, document: Any, budget: _Budget) -> bool:
        return all(member.evaluate(document, budget) for member in self.members)


@dataclass(frozen=True)
class _AnyOf:
    members: tuple[_Node, ...]

    def evaluate(self, document: Any, budget: _Budget) -> bool:
        return any(member.evaluate(document, budget) for member in self.members)


@dataclass(frozen=True)
class _Not:
    member: _Node

    def evaluate(self, document: Any, budget: _Budget) -> bool:
        return not self.member.evaluate(document, budget)


_Node = _Condition | _All | _AnyOf | _Not


def _build(filter: Mapping[str, Any]) -> _Node:
    regexes = [_compile_regex(c["regex"]) for _, c in _conditions(filter, "") if "regex" in c]
    total = sum(map(_program_size, regexes))
    subject_limit = min(MAX_SUBJECT_LENGTH, MAX_REGEX_WORK // max(total, 1))
    return _build_node(filter, iter(regexes), subject_limit)


def _build_node(node: Mapping[str, Any], regexes: Iterator[Any], subject_limit: int) -> _Node:
    """`regexes` are the compiled patterns in `_conditions` order (depth first, in order)."""
    if "$not" in node:
        return _Not(_build_node(node["$not"], regexes, subject_limit))
    if "$and" in node:
        return _All(tuple(_build_node(member, regexes, subject_limit) for member in node["$and"]))
    if "$or" in node:
        return _AnyOf(tuple(_build_node(member, regexes, subject_limit) for member in node["$or"]))
    (op,) = node.keys() - {"path"}
    path = tuple(
        (key, int(key) if key.isascii() and key.isdigit() else None) for key in node["path"].split(".")
    )
    if op == "regex":
        return _Condition(path, op, node[op], next(regexes), subject_limit)
    if op in ("in", "not_in"):  # a set lookup, so a long list costs no more than a short one
        scalars = frozenset(item for item in node[op] if _is_scalar(item))
        others = tuple(item for item in node[op] if not _is_scalar(item))
        return _Condition(path, op, node[op], scalars=scalars, others=others)
    return _Condition(path, op, node[op])


def _regex_subject_limit(node: _Node) -> int:
    if isinstance(node, _Condition):
        return node.subject_limit if node.op == "regex" else MAX_SUBJECT_LENGTH
    members = (node.member,) if isinstance(node, _Not) else node.members
    return min(map(_regex_subject_limit, members), default=MAX_SUBJECT_LENGTH)


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_json_equal(a[key], b[key]) for key in a)
    return bool(a == b)


def _has_member(items: Sequence[Any], needle: Any, budget: _Budget) -> bool:
    for i, item in enumerate(items):
        if i % 1024 == 1023:
            budget.check()  # a long list is Python-level work, so it can and must stop
        if _json_equal(item, needle):
            return True
    return False


def _is_scalar(value: Any) -> bool:
    """A string or a number: JSON equality on these is Python's, hash included (1 == 1.0)."""
    return isinstance(value, str) or _is_number(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _searchable(subject: str | bytes) -> bool:
    return len(subject) <= MAX_SUBJECT_LENGTH
