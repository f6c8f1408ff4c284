"""JSON Schema for schemas that users and MCP servers write: regexes run in RE2 (linear time).

jsonschema's own ``pattern``, ``patternProperties`` and ``additionalProperties``
keywords call Python's backtracking ``re``, so a pattern such as ``^(a+)+$`` on
thirty characters holds a thread for minutes. Every schema an automation's
author, an admin or an MCP server supplies (automation inputs, agent output
schemas, standing approvals' ``arg_constraint``, MCP tools' input schemas) is
validated here instead:

* ``pattern``, ``patternProperties`` (and the property matching of
  ``additionalProperties``) and ``format: "regex"`` use RE2; a pattern RE2
  cannot compile (backreferences, lookaround) is refused by :func:`check_schema`
  at save with its path, and fails validation wherever a schema was not checked;
* ``$schema`` inside a schema is ignored (it would switch jsonschema to its
  stock validator class, and so back to ``re``): every schema is 2020-12;
* ``$ref`` must point inside the schema (``#...``): no remote schema is ever
  fetched;
* ``unevaluatedProperties`` next to ``patternProperties`` or a ``$ref`` is
  refused (jsonschema's evaluation of it matches those patterns with ``re``).

RE2 differs from ``re`` in small ways: ``\\d``, ``\\w`` and ``\\s`` are ASCII.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from typing import Any

import re2
from jsonschema import Draft202012Validator, FormatChecker, ValidationError, validators
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from referencing import Registry

__all__ = ["SchemaError", "check_schema", "schema_problem", "validator"]

_OPTIONS = re2.Options()
_OPTIONS.never_capture = True  # only "does it match" is asked
_OPTIONS.log_errors = False


@functools.lru_cache(maxsize=2048)
def _compiled(pattern: str) -> Any | None:
    """The compiled RE2 regex, or None when RE2 refuses the pattern."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except (re2.error, UnicodeError, TypeError, ValueError):
        return None


def _regex(pattern: Any) -> Any | None:
    return _compiled(pattern) if isinstance(pattern, str) else None


def _refused(pattern: Any) -> ValidationError:
    return ValidationError(
        f"{str(pattern)[:200]!r} is not a regex RE2 accepts (no backreferences, no lookaround)"
    )


def _pattern(validator: Any, patrn: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string"):
        return
    regex = _regex(patrn)
    if regex is None:
        yield _refused(patrn)
    elif not regex.search(instance):
        yield ValidationError(f"{instance[:200]!r} does not match {patrn[:200]!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        regex = _regex(pattern)
        if regex is None:
            yield _refused(pattern)
            continue
        for key, value in instance.items():
            if regex.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _extras(instance: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    properties = schema.get("properties", {})
    regexes = [_regex(p) for p in schema.get("patternProperties", {})]
    return [
        key
        for key in instance
        if key not in properties and not any(r is not None and r.search(key) for r in regexes)
    ]


def _additional_properties(validator: Any, ap: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    extras = _extras(instance, schema)
    if validator.is_type(ap, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], ap, path=extra)
    elif not ap and extras:
        listed = ", ".join(repr(e) for e in sorted(extras, key=str)[:20])
        yield ValidationError(f"Additional properties are not allowed ({listed[:300]} unexpected)")


def _walks_patterns(node: Any) -> bool:
    """Whether ``node`` (a schema) holds patternProperties or a reference anywhere."""
    if isinstance(node, list):
        return any(_walks_patterns(n) for n in node)
    if not isinstance(node, dict):
        return False
    if {"patternProperties", "$ref", "$dynamicRef"} & node.keys():
        return True
    return any(_walks_patterns(v) for k, v in node.items() if k not in _DATA_KEYWORDS)


_STOCK_UNEVALUATED = Draft202012Validator.VALIDATORS["unevaluatedProperties"]
_UNEVALUATED_REFUSED = "unevaluatedProperties cannot be combined with patternProperties or $ref here"


def _unevaluated_properties(validator: Any, up: Any, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    if _walks_patterns(schema):
        yield ValidationError(_UNEVALUATED_REFUSED)
        return
    yield from _STOCK_UNEVALUATED(validator, up, instance, schema)


_RE2Validator = validators.extend(
    Draft202012Validator,
    validators={
        "pattern": _pattern,
        "patternProperties": _pattern_properties,
        "additionalProperties": _additional_properties,
        "unevaluatedProperties": _unevaluated_properties,
    },
)

FORMAT_CHECKER = FormatChecker()  # every format jsonschema knows, with "regex" meaning RE2


@FORMAT_CHECKER.checks("regex", raises=ValueError)
def _is_regex(instance: object) -> bool:
    return not isinstance(instance, str) or _compiled(instance) is not None


# Keywords whose values are data (or names), not schemas.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "required", "dependentRequired"})
# Keywords whose values map names to schemas.
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _without_dialects(node: Any) -> Any:
    """``node`` without ``$schema`` keywords (which would pick jsonschema's stock classes)."""
    if isinstance(node, list):
        return [_without_dialects(n) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$schema":
            continue
        if key in _DATA_KEYWORDS:
            out[key] = value
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _without_dialects(sub) for name, sub in value.items()}
        else:
            out[key] = _without_dialects(value)
    return out


_NO_RETRIEVAL: Registry = Registry()  # an empty registry: a remote $ref is unresolvable, never fetched


def validator(schema: Any, *, formats: bool = False) -> Validator:
    """A validator for ``schema`` whose regexes run in RE2; ``formats`` asserts ``format``."""
    return _RE2Validator(
        _without_dialects(schema),
        format_checker=FORMAT_CHECKER if formats else None,
        registry=_NO_RETRIEVAL,
    )


def _refs(node: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], str, str]]:
    """(path, keyword, problem) for the structural rules the metaschema does not know."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            yield from _refs(item, (*path, i))
        return
    if not isinstance(node, dict):
        return
    for key in ("$ref", "$dynamicRef"):
        ref = node.get(key)
        if isinstance(ref, str) and not ref.startswith("#"):
            yield (
                (*path, key),
                key,
                f"{key} must point inside the schema ('#...'): remote schemas are not fetched",
            )
    if "unevaluatedProperties" in node and _walks_patterns(node):
        yield (*path, "unevaluatedProperties"), "unevaluatedProperties", _UNEVALUATED_REFUSED
    for key, value in node.items():
        if key in _DATA_KEYWORDS:
            continue
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                yield from _refs(sub, (*path, key, name))
        else:
            yield from _refs(value, (*path, key))


def check_schema(schema: Any) -> None:
    """Raise ``SchemaError`` (with ``absolute_path``) unless ``schema`` is a schema this module runs.

    The 2020-12 metaschema, with every ``pattern`` and ``patternProperties`` key an RE2 regex,
    plus the rules in the module docstring."""
    schema = _without_dialects(schema)
    Draft202012Validator.check_schema(schema, format_checker=FORMAT_CHECKER)
    for path, keyword, problem in _refs(schema, ()):
        raise SchemaError(problem, validator=keyword, path=path)


def schema_problem(schema: Any) -> tuple[str, str] | None:
    """(JSON pointer into ``schema``, message) of its first problem, or None."""
    try:
        check_schema(schema)
    except SchemaError as exc:
        pointer = "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in exc.absolute_path)
        message = exc.message[:300]
        if exc.validator == "format" and exc.validator_value == "regex":
            message = f"{message}: RE2 runs in linear time, so it has no backreferences and no lookaround"
        return pointer, message
    return None
