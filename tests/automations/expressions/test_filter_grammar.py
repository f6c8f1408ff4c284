"""The domain-event filter grammar (SPEC §6.3). Pure module: no database."""

from __future__ import annotations

import pickle
import random
import time
from typing import Any

import jsonschema
import pytest

from automations.expressions.filter_grammar import (
    FILTER_SCHEMA,
    MAX_CONDITIONS,
    MAX_DEPTH,
    MAX_LIST_LENGTH,
    MAX_REGEX_LENGTH,
    MAX_REGEX_PROGRAM_SIZE,
    MAX_REGEX_WORK,
    MAX_SUBJECT_LENGTH,
    OPERATORS,
    FilterBudgetExceeded,
    FilterError,
    compile_filter,
    validate_filter,
)

# Generous against the 10 ms budget. Timed in this thread's CPU time (the budget's own clock), not
# wall time, which a loaded 2-core CI machine stretches at random.
SLOW_SECONDS = 0.050

EVENT: dict[str, Any] = {
    "event_type": "files.added",
    "source": "api",
    "payload": {
        "name": "report.csv",
        "size": 120,
        "ratio": 0.5,
        "flag": True,
        "owner": None,
        "tags": ["q3", "finance"],
        "items": [{"name": "a", "qty": 2}, {"name": "b", "qty": 0}],
        "matrix": [[1, 2], [3, 4]],
        "codes": {"0": "zero"},
    },
}


def matches(filter: Any, document: Any = EVENT) -> bool:
    return compile_filter(filter).matches(document)


def issues(filter: Any) -> list[tuple[str, str]]:
    return [(issue.path, issue.code) for issue in validate_filter(filter)]


def cond(op: str, value: Any, path: str = "payload.name") -> dict[str, Any]:
    return {"path": path, op: value}


def nested(depth: int) -> dict[str, Any]:
    """A filter `depth` levels deep: a condition under depth - 1 alternating $not / $and."""
    filter: dict[str, Any] = cond("exists", True)
    for level in range(depth - 1):
        filter = {"$not": filter} if level % 2 else {"$and": [filter]}
    return filter


# --- operators ---------------------------------------------------------------------

OPERATOR_CASES = [
    ("equals", "payload.name", "report.csv", True),
    ("equals", "payload.name", "report.txt", False),
    ("equals", "payload.size", 120.0, True),
    ("equals", "payload.size", "120", False),
    ("equals", "payload.flag", True, True),
    ("equals", "payload.flag", 1, False),  # JSON true is not 1, though it is in Python
    ("equals", "payload.owner", None, True),
    ("equals", "payload.tags", ["q3", "finance"], True),
    ("equals", "payload.tags", ["finance", "q3"], False),
    ("equals", "payload.items.0", {"qty": 2, "name": "a"}, True),
    ("equals", "payload.items.0", {"qty": True, "name": "a"}, False),
    ("not_equals", "payload.name", "report.txt", True),
    ("not_equals", "payload.name", "report.csv", False),
    ("not_equals", "payload.flag", 1, True),
    ("starts_with", "payload.name", "rep", True),
    ("starts_with", "payload.name", "csv", False),
    ("starts_with", "payload.size", "1", False),
    ("ends_with", "payload.name", ".csv", True),
    ("ends_with", "payload.name", ".txt", False),
    ("ends_with", "payload.tags", "finance", False),
    ("contains", "payload.name", "port", True),
    ("contains", "payload.name", "xyz", False),
    ("contains", "payload.name", 1, False),
    ("contains", "payload.tags", "q3", True),
    ("contains", "payload.tags", "q4", False),
    ("contains", "payload.items", {"name": "b", "qty": 0}, True),
    ("contains", "payload.items", {"name": "b", "qty": False}, False),
    ("contains", "payload.size", 1, False),
    ("regex", "payload.name", r"^rep\w+\.csv$", True),
    ("regex", "payload.name", r"port", True),  # unanchored search
    ("regex", "payload.name", r"^\d+$", False),
    ("regex", "payload.size", r"1", False),
    ("gt", "payload.size", 100, True),
    ("gt", "payload.size", 120, False),
    ("gte", "payload.size", 120, True),
    ("gte", "payload.size", 120.5, False),
    ("lt", "payload.ratio", 1, True),
    ("lt", "payload.size", 120, False),
    ("lte", "payload.size", 120, True),
    ("lte", "payload.size", 119, False),
    ("gt", "payload.name", "abc", True),  # strings compare with strings
    ("lt", "payload.name", "abc", False),
    ("gt", "payload.size", "100", False),  # ... and never with numbers
    ("lt", "payload.name", 1, False),
    ("gte", "payload.flag", 0, False),  # a boolean is not a number
    ("gt", "payload.tags", 0, False),
    ("in", "payload.name", ["x", "report.csv"], True),
    ("in", "payload.name", ["x"], False),
    ("in", "payload.size", [120.0], True),
    ("in", "payload.flag", [1], False),
    ("not_in", "payload.name", ["x"], True),
    ("not_in", "payload.name", ["x", "report.csv"], False),
    ("exists", "payload.owner", True, True),  # present, though null
    ("exists", "payload.owner", False, False),
    ("exists", "payload.nope", True, False),
    ("exists", "payload.nope", False, True),
]


@pytest.mark.parametrize(("op", "path", "value", "expected"), OPERATOR_CASES)
def test_operator(op: str, path: str, value: Any, expected: bool) -> None:
    assert matches(cond(op, value, path)) is expected


def test_every_operator_has_a_true_and_a_false_case() -> None:
    outcomes = {(op, expected) for op, _, _, expected in OPERATOR_CASES}
    assert outcomes == {(op, expected) for op in OPERATORS for expected in (True, False)}


# --- paths -------------------------------------------------------------------------

MISSING_PATHS = [
    "payload.nope",
    "nope.deeper",
    "payload.items.5.name",  # index out of range
    "payload.items.-1",  # no negative indexes
    "payload.tags.first",  # a key into a list
    "payload.size.0",  # into a number
    "payload.name.0",  # a string is not a list
    "payload.owner.x",  # through null
]
ANY_VALUE = {"equals": "x", "contains": "x", "starts_with": "x", "ends_with": "x", "regex": ".*", "gt": 0}
ANY_VALUE |= {"gte": 0, "lt": 0, "lte": 0, "in": ["x"], "not_in": ["x"], "not_equals": "x"}


@pytest.mark.parametrize("path", MISSING_PATHS)
@pytest.mark.parametrize("op", OPERATORS)
def test_missing_path_is_false_except_for_exists_false_and_not_equals(op: str, path: str) -> None:
    for value in [True, False] if op == "exists" else [ANY_VALUE[op]]:
        expected = op == "not_equals" or (op == "exists" and value is False)
        assert matches(cond(op, value, path)) is expected, value


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("payload.items.0.name", "a"),
        ("payload.items.1.qty", 0),
        ("payload.tags.1", "finance"),
        ("payload.matrix.1.0", 3),
        ("payload.codes.0", "zero"),  # a digit segment is an object key when the value is an object
        ("event_type", "files.added"),
    ],
)
def test_path_reads_object_keys_and_list_indexes(path: str, value: Any) -> None:
    assert matches(cond("equals", value, path))


def test_non_mapping_document_matches_nothing_but_absence() -> None:
    assert not matches(cond("exists", True, "payload"), None)
    assert matches(cond("exists", False, "payload"), ["payload"])


# --- composition -------------------------------------------------------------------

YES = cond("equals", "report.csv")
NO = cond("equals", "other.csv")


@pytest.mark.parametrize(
    ("filter", "expected"),
    [
        ({"$and": [YES, YES]}, True),
        ({"$and": [YES, NO]}, False),
        ({"$and": [YES]}, True),
        ({"$or": [NO, YES]}, True),
        ({"$or": [NO, NO]}, False),
        ({"$not": NO}, True),
        ({"$not": YES}, False),
        ({"$not": {"$not": YES}}, True),
        ({"$or": [{"$and": [YES, NO]}, {"$not": {"$or": [NO]}}]}, True),
        ({"$and": [{"$or": [NO, YES]}, {"$not": {"$and": [YES, YES]}}]}, False),
    ],
)
def test_composition(filter: dict[str, Any], expected: bool) -> None:
    assert matches(filter) is expected


def test_not_of_a_missing_path_condition_is_true() -> None:
    assert matches({"$not": cond("in", ["x"], "payload.nope")})
    assert not matches(cond("not_in", ["x"], "payload.nope"))


def test_spec_section_3_example_filter_validates_and_matches() -> None:
    # given the event trigger filter of SPEC §3
    spec_filter = {"$and": [{"path": "payload.size", "gt": 0}, {"path": "payload.name", "ends_with": ".csv"}]}
    event = {"event_type": "files.added", "source": "api", "payload": {"size": 2048, "name": "orders.csv"}}
    # then
    assert validate_filter(spec_filter) == []
    assert matches(spec_filter, event)
    assert not matches(spec_filter, event | {"payload": {"size": 0, "name": "orders.csv"}})
    assert not matches(spec_filter, event | {"payload": {"size": 2048, "name": "orders.txt"}})
    assert not matches(spec_filter, event | {"payload": {"name": "orders.csv"}})


# --- the schema and the validator --------------------------------------------------

SCHEMA_INVALID = [
    (cond("near", 1), ""),  # unknown operator
    ({"path": "a", "gt": 1, "lt": 2}, ""),  # two operators
    ({"path": "a"}, ""),  # no operator
    ({"equals": 1}, ""),  # no path
    ({"path": "a", "equals": 1, "note": "x"}, ""),  # extra key on a condition
    ({"$and": [YES], "note": "x"}, ""),  # extra key on a composition
    ({"$and": [YES], "$or": [YES]}, ""),
    ({"$and": YES}, "/$and"),  # not a list
    ({"$and": []}, "/$and"),
    ({"$or": []}, "/$or"),
    ({"$not": [YES]}, "/$not"),
    ({"$and": [YES, "yes"]}, "/$and/1"),
    ({"$or": [YES, {"$not": cond("equals", 1, "a..b")}]}, "/$or/1/$not/path"),
    (cond("equals", 1, ""), "/path"),
    (cond("equals", 1, ".a"), "/path"),
    (cond("equals", 1, "a" * 257), "/path"),
    ({"path": 3, "equals": 1}, "/path"),
    (cond("exists", "yes"), "/exists"),
    (cond("in", "x"), "/in"),
    (cond("not_in", {"x": 1}), "/not_in"),
    (cond("starts_with", 1), "/starts_with"),
    (cond("ends_with", None), "/ends_with"),
    (cond("gt", True), "/gt"),
    (cond("lte", None), "/lte"),
    (cond("gte", [1]), "/gte"),
    ([YES], ""),
    ("payload.size > 0", ""),
    (None, ""),
    ({}, ""),
]
SCHEMA_VALID = [
    YES,
    {"$and": [YES, {"$or": [NO, {"$not": YES}]}]},
    *(cond(op, ANY_VALUE.get(op, True)) for op in OPERATORS),
    cond("equals", {"nested": [1, None, {"x": False}]}),
    cond("in", []),
    cond("gt", "2024-01-01"),
    cond("exists", False, "payload.items.0.name"),
]


@pytest.mark.parametrize(("filter", "pointer"), SCHEMA_INVALID)
def test_validator_rejects_malformed_filter_where_the_mistake_is(filter: Any, pointer: str) -> None:
    assert issues(filter)[0] == (pointer, "invalid_filter")
    assert all(issue.message for issue in validate_filter(filter))


def test_two_operators_in_one_condition_says_so() -> None:
    (issue,) = validate_filter({"$and": [YES, {"path": "a", "gt": 1, "lt": 2}]})
    assert issue.path == "/$and/1"
    assert "exactly one operator" in issue.message


def test_filter_schema_is_a_valid_draft_2020_12_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(FILTER_SCHEMA)
    assert FILTER_SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert FILTER_SCHEMA["$id"] == "https://autoplane.dev/schema/filter.json"


@pytest.mark.parametrize("filter", [f for f, _ in SCHEMA_INVALID] + SCHEMA_VALID)
def test_validator_agrees_with_the_published_schema(filter: Any) -> None:
    schema_says_valid = jsonschema.Draft202012Validator(FILTER_SCHEMA).is_valid(filter)
    assert (validate_filter(filter) == []) is schema_says_valid


@pytest.mark.parametrize(
    "filter",
    [nested(MAX_DEPTH + 1), {"$and": [YES] * (MAX_CONDITIONS + 1)}, cond("regex", r"(a)\1")],
)
def test_validator_goes_beyond_the_schema_only_for_limits_and_regexes(filter: Any) -> None:
    assert jsonschema.Draft202012Validator(FILTER_SCHEMA).is_valid(filter)
    assert issues(filter)[0][1] in {"filter_too_deep", "filter_too_large", "invalid_regex"}


def test_compile_filter_raises_filter_error_with_the_issues() -> None:
    with pytest.raises(FilterError) as caught:
        compile_filter({"$and": [YES, cond("regex", "(?=a)")]})
    assert [(i.path, i.code) for i in caught.value.issues] == [("/$and/1/regex", "invalid_regex")]
    assert "/$and/1/regex" in str(caught.value)


def test_compiled_filter_does_not_see_later_changes_to_the_source() -> None:
    source = {"$and": [cond("in", ["report.csv"])]}
    compiled = compile_filter(source)
    source["$and"][0]["in"].clear()
    assert compiled.matches(EVENT)


# --- limits ------------------------------------------------------------------------


def test_filter_exactly_max_depth_deep_is_accepted() -> None:
    assert validate_filter(nested(MAX_DEPTH)) == []
    assert matches(nested(MAX_DEPTH)) in (True, False)


def test_filter_one_level_too_deep_is_rejected_at_the_too_deep_node() -> None:
    assert MAX_DEPTH == 8
    (issue,) = validate_filter(nested(MAX_DEPTH + 1))
    assert issue.code == "filter_too_deep"
    assert issue.path.count("/$not") + issue.path.count("/$and/0") == MAX_DEPTH


def test_hostile_nesting_is_rejected_without_recursing() -> None:
    filter: dict[str, Any] = YES
    for _ in range(100_000):
        filter = {"$not": filter}
    assert issues(filter) == [("/$not" * MAX_DEPTH, "filter_too_deep")]


def test_max_conditions_are_accepted_and_one_more_is_rejected() -> None:
    assert MAX_CONDITIONS == 64
    within = {"$or": [{"$and": [YES] * 32}, {"$and": [NO] * 31}, {"$not": NO}]}
    beyond = {"$or": [{"$and": [YES] * 32}, {"$and": [NO] * 32}, {"$not": NO}]}
    assert validate_filter(within) == []
    assert matches(within)
    assert issues(beyond) == [("", "filter_too_large")]
    assert issues({"$and": [YES] * 65}) == [("", "filter_too_large")]


# --- regexes and the evaluation budget ---------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [r"(a)\1", r"(?P<x>a)(?P=x)", r"(?=a)", r"(?!a)b", r"(?<=a)b", r"(?<!a)b"],
)
def test_backreferences_and_lookaround_are_rejected_with_a_clear_message(pattern: str) -> None:
    (issue,) = validate_filter({"$and": [YES, cond("regex", pattern)]})
    assert (issue.path, issue.code) == ("/$and/1/regex", "invalid_regex")
    assert "backreferences" in issue.message
    assert "lookaround" in issue.message


@pytest.mark.parametrize("pattern", ["[", "a{2,1}", "x" * (MAX_REGEX_LENGTH + 1), 5])
def test_invalid_or_too_long_regex_is_rejected(pattern: Any) -> None:
    assert issues(cond("regex", pattern)) == [("/regex", "invalid_regex")]


@pytest.mark.parametrize("pattern", ["[ab]*a[ab]{990}c", "[ab]*a[ab]{300}c", r"\pL"])
def test_a_regex_over_the_program_size_is_too_complex(pattern: str) -> None:
    (issue,) = validate_filter(cond("regex", pattern))
    assert (issue.path, issue.code) == ("/regex", "regex_too_complex")
    assert f"at most {MAX_REGEX_PROGRAM_SIZE}" in issue.message


def test_the_program_size_bound_is_for_all_the_filters_regexes_together() -> None:
    # given: regexes of 57 instructions each, each fine on its own
    one = cond("regex", "[ab]*a[ab]{50}c")
    assert validate_filter(one) == []
    # when / then: the one that takes the total past the bound is named
    assert validate_filter({"$or": [one] * 5}) == []
    assert issues({"$or": [one] * 6}) == [("/$or/5/regex", "regex_too_complex")]


def test_in_lists_are_bounded() -> None:
    assert validate_filter(cond("in", list(range(MAX_LIST_LENGTH)))) == []
    assert issues(cond("in", list(range(MAX_LIST_LENGTH + 1)))) == [("/in", "list_too_long")]
    assert issues(cond("not_in", ["x"] * 100_000)) == [("/not_in", "list_too_long")]


def test_the_regex_subject_limit_shares_out_the_regex_work() -> None:
    small = compile_filter(cond("regex", "^a"))  # 4 instructions
    largest = compile_filter({"$or": [cond("regex", "[ab]*a[ab]{50}c")] * 5})  # 5 x 57
    assert small.regex_subject_limit == MAX_REGEX_WORK // 4
    assert largest.regex_subject_limit == MAX_REGEX_WORK // (5 * 57)
    assert compile_filter(cond("equals", 1)).regex_subject_limit == MAX_SUBJECT_LENGTH


def test_regex_of_max_length_is_accepted() -> None:
    assert validate_filter(cond("regex", "x" * MAX_REGEX_LENGTH)) == []


def test_catastrophic_backtracking_pattern_runs_in_linear_time() -> None:
    # given a pattern that takes exponential time in a backtracking engine
    subject = "a" * 30_000 + "b"
    document = {"payload": {"name": subject}}
    assert len(subject) <= compile_filter(cond("regex", "(a+)+b$")).regex_subject_limit  # searched
    # when
    started = time.thread_time()
    no_match = matches(cond("regex", "(a+)+$"), document)
    match = matches(cond("regex", "(a+)+b$"), document)
    elapsed = time.thread_time() - started
    # then
    assert (no_match, match) == (False, True)
    assert elapsed < SLOW_SECONDS


def test_huge_document_stays_within_budget() -> None:
    # given a 10 MB string and a filter touching it with every string operator
    body = "x" * 10_000_000 + "needle"
    document = {"payload": {"body": body}}
    filter = {
        "$and": [
            cond("starts_with", "xxx", "payload.body"),
            cond("ends_with", "needle", "payload.body"),
            cond("not_equals", "x", "payload.body"),
            cond("gt", "a", "payload.body"),
            cond("not_in", ["x", "y"], "payload.body"),
            {"$not": cond("contains", "needle", "payload.body")},  # too long to search
            {"$not": cond("regex", "needle", "payload.body")},
        ]
    }
    compiled = compile_filter(filter)
    # when
    started = time.thread_time()
    result = compiled.matches(document)
    elapsed = time.thread_time() - started
    # then
    assert result is True
    assert elapsed < SLOW_SECONDS


def test_subjects_are_searched_up_to_the_cap_and_not_beyond() -> None:
    at_cap = {"payload": {"s": "x" * (MAX_SUBJECT_LENGTH - 1) + "!"}}
    beyond = {"payload": {"s": "x" * MAX_SUBJECT_LENGTH + "!"}}
    assert matches(cond("contains", "!", "payload.s"), at_cap)
    assert not matches(cond("contains", "!", "payload.s"), beyond)
    # a regex searches what its share of the regex work allows, at most the same cap
    limit = compile_filter(cond("regex", "!$")).regex_subject_limit
    assert limit == MAX_REGEX_WORK // 5
    assert matches(cond("regex", "!$", "payload.s"), {"payload": {"s": "x" * (limit - 1) + "!"}})
    assert not matches(cond("regex", "!$", "payload.s"), {"payload": {"s": "x" * limit + "!"}})
    # a bigger regex searches less: the work per event is what is bounded
    compiled = compile_filter(cond("regex", "[ab]*a[ab]{200}!$", "payload.s"))
    limit = compiled.regex_subject_limit
    assert limit < 2000
    assert compiled.matches({"payload": {"s": "a" * (limit - 1) + "!"}})
    assert not compiled.matches({"payload": {"s": "a" * limit + "!"}})
    # a regex sees UTF-8 bytes: 40,000 "é" are 80,000 bytes
    wide = {"payload": {"s": "é" * 40_000}}
    assert matches(cond("contains", "é", "payload.s"), wide)
    assert not matches(cond("regex", "é", "payload.s"), wide)


def test_huge_list_scan_stops_at_the_budget() -> None:
    # given a list far too long to scan in 10 ms
    document = {"payload": {"ids": list(range(5_000_000))}}
    compiled = compile_filter(cond("contains", "absent", "payload.ids"))
    # when
    started = time.thread_time()  # the budget is CPU time: a loaded machine's wall clock would flake
    with pytest.raises(FilterBudgetExceeded):
        compiled.matches(document)
    elapsed = time.thread_time() - started
    # then
    assert elapsed < SLOW_SECONDS


def test_exceeded_budget_raises_an_auditable_filter_error() -> None:
    compiled = compile_filter({"$and": [YES, YES]})
    with pytest.raises(FilterBudgetExceeded) as caught:
        compiled.matches(EVENT, budget_seconds=-1)
    error = caught.value
    assert isinstance(error, FilterError)
    assert [(issue.path, issue.code) for issue in error.issues] == [("", "filter_budget_exceeded")]
    assert pickle.loads(pickle.dumps(error)).issues == error.issues


def test_one_slow_condition_past_the_budget_is_reported_too() -> None:
    # given a linear-time but DFA-hostile regex (RE2's worst case) and a subject at its limit
    compiled = compile_filter(cond("regex", "[ab]*a[ab]{200}c", "payload.text"))
    text = "".join(random.Random(0).choices("ab", k=compiled.regex_subject_limit))
    # when / then: no later condition to check the deadline before, yet it raises
    with pytest.raises(FilterBudgetExceeded):
        compiled.matches({"payload": {"text": text}}, budget_seconds=1e-6)


def test_typical_evaluation_is_far_below_the_budget() -> None:
    filter = {
        "$and": [
            cond("regex", r"(?i)^[a-z]+\.(csv|xlsx)$"),
            {"$or": [cond("gt", 100, "payload.size"), cond("contains", "urgent", "payload.tags")]},
            {"$not": cond("in", ["deleted", "archived"], "payload.state")},
            cond("equals", "a", "payload.items.0.name"),
        ]
    }
    compiled = compile_filter(filter)
    started = time.thread_time()
    for _ in range(1000):
        assert compiled.matches(EVENT)
    assert (time.thread_time() - started) / 1000 < 0.001
