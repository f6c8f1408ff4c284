"""``input_mapping``: JSONPath expressions that pick a trigger's inputs out of a document.

Pure (no Django). Used by webhook triggers (the document is the request body)
and event triggers (the document is the event: ``{id, event_type, source, payload}``).

Semantics of ``{"branch": "$.ref", "ids": "$.items[*].id"}``:

- an expression that matches nothing leaves the input out, so the automation's
  input schema decides (its ``default`` applies, or ``required`` rejects the fire);
- exactly one match gives that value;
- several matches give the list of values, in document order.

Only basic JSONPath (``jsonpath_ng.parse``: fields, indexes, slices, ``*``, ``..``)
is accepted; the extended grammar (filters, arithmetic) is not, because arithmetic
on caller-supplied strings and numbers can allocate without bound.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from jsonpath_ng import JSONPath, parse

MAX_EXPRESSION_LENGTH = 256


class MappingError(Exception):
    def __init__(self, input_name: str, message: str):
        super().__init__(f"input_mapping.{input_name}: {message}")
        self.input_name = input_name
        self.message = message


@lru_cache(maxsize=2048)
def compile_path(expression: str) -> JSONPath:
    """The parsed expression; raises ValueError when it is not basic JSONPath."""
    if (
        not isinstance(expression, str)
        or not expression.startswith("$")
        or len(expression) > MAX_EXPRESSION_LENGTH
    ):
        raise ValueError("a JSONPath expression starts with '$' and has at most 256 characters")
    try:
        return parse(expression)
    except Exception as exc:  # JSONPathError, and plain Exceptions from ply on some inputs
        raise ValueError(f"not a JSONPath expression ({type(exc).__name__})") from None


def validate_mapping(mapping: Any) -> list[tuple[str, str]]:
    """``(input name, problem)`` for every expression that does not compile."""
    if mapping is None:
        return []
    if not isinstance(mapping, Mapping):
        return [("", "input_mapping must be an object")]
    problems = []
    for name, expression in mapping.items():
        try:
            compile_path(expression)
        except ValueError as exc:
            problems.append((str(name), str(exc)))
    return problems


def map_inputs(mapping: Mapping[str, str], document: Any) -> dict[str, Any]:
    """Apply ``mapping`` to ``document``; raises MappingError on a bad expression."""
    inputs: dict[str, Any] = {}
    for name, expression in mapping.items():
        try:
            path = compile_path(expression)
        except ValueError as exc:
            raise MappingError(name, str(exc)) from None
        try:
            values = [match.value for match in path.find(document)]
        except RecursionError:
            raise MappingError(name, "the document is nested too deeply to search") from None
        except Exception as exc:  # jsonpath_ng on unexpected shapes
            raise MappingError(name, f"could not be evaluated ({type(exc).__name__})") from None
        if len(values) == 1:
            inputs[name] = values[0]
        elif values:
            inputs[name] = values
    return inputs
