"""Saving a definition never evaluates a template outside the sandbox's limits (issue 12, finding 1).

Finding names in a template generates code, and Jinja's code generator folds constant
expressions, filters included. Done in a plain environment, a ~90-byte template held a web
worker for seconds and gigabytes. Every hostile template of the corpus, saved inside a
definition, is now refused or accepted within 1 s and 100 MB.
"""

from __future__ import annotations

import time
import tracemalloc
from typing import Any

import pytest

from automations.definition import validate_definition
from automations.expressions import template
from tests.automations.expressions.template_corpus import CORPUS
from tests.factories import definition, transform

WALL_LIMIT_SECONDS = 1.0
MEMORY_LIMIT_BYTES = 100 * 1024 * 1024


def saved_with(source: str) -> dict[str, Any]:
    return definition(transform("t", {"value": source}), execution={"concurrency_key": "k"})


def validate_measured(body: dict[str, Any]) -> tuple[list[dict[str, str]], float, int]:
    """Issues, wall seconds and peak traced bytes of a cold save-time validation.

    Timed and traced in two runs, each on a cold compile cache: tracing slows Python ~4x.
    """
    template._compile.cache_clear()
    started = time.perf_counter()
    issues = validate_definition(body)
    elapsed = time.perf_counter() - started
    template._compile.cache_clear()
    tracemalloc.start()
    try:
        validate_definition(body)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return issues, elapsed, peak


@pytest.mark.parametrize("case", CORPUS, ids=[case["id"] for case in CORPUS])
def test_validating_a_definition_with_a_hostile_template_is_bounded(case: dict[str, Any]) -> None:
    # when
    issues, elapsed, peak = validate_measured(saved_with(case["template"]))
    # then
    assert elapsed < WALL_LIMIT_SECONDS, elapsed
    assert peak < MEMORY_LIMIT_BYTES, peak
    if case["static"]:
        assert {issue["code"] for issue in issues} & {"TEMPLATE_ERROR", "TEMPLATE_LIMIT"}, issues


def test_a_constant_filter_over_a_large_string_is_not_folded_at_save() -> None:
    # given: the reported payload, a dozen times in one value
    source = "{{ ('a' * 3000)|replace('a', 'b' * 900000)|length }}" * 12
    # when
    issues, elapsed, peak = validate_measured(saved_with(source))
    # then
    assert issues == []
    assert elapsed < WALL_LIMIT_SECONDS
    assert peak < MEMORY_LIMIT_BYTES


def test_names_are_still_found_for_undefined_reference_checks() -> None:
    issues = validate_definition(saved_with("{{ nope.x }} {% set a = 1 %}{{ a }} {{ inputs.n }}"))
    assert [(issue["code"], issue["message"]) for issue in issues] == [
        ("undefined_reference", "'nope' is not defined at this point")
    ]
