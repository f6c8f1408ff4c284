"""The template sandbox (SPEC §4): behaviour, limits and the hostile-payload corpus. No database."""

from __future__ import annotations

import copy
import gc
import threading
import time
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest
from template_corpus import CORPUS

from automations.expressions.template import (
    ALLOWED_FILTERS,
    ALLOWED_TESTS,
    MAX_OUTPUT_BYTES,
    MAX_SOURCE_BYTES,
    RENDER_BUDGET_SECONDS,
    WALL_BACKSTOP_SECONDS,
    TemplateError,
    TemplateLimitError,
    evaluate_predicate,
    is_template,
    iter_templates,
    render,
    render_value,
    validate_template,
)

# Generous against the 100 ms budget: a loaded 2-core CI machine must not flake, while a
# render that was not stopped would take seconds to hours.
WALL_LIMIT_SECONDS = 1.0
CPU_LIMIT_SECONDS = 0.5
LEAKS = (
    "<class",
    "object at 0x",
    "0x",
    "Traceback",
    "/work",
    "site-packages",
    "jinja2",
    'File "',
    "<function",
)


def context_for(hint: str) -> dict[str, Any]:
    if hint == "empty":
        return {}
    context: dict[str, Any] = {
        "s": "hello",
        "n": 10**8,
        "base": 9,
        "e": 10**10,
        "x": list(range(200)),
        "d": {"a": 1, "b": [1, 2]},
        "fmt": "format",
        "u": "__class__",
        "fmt_width": "%999999999s",
        "nul": "a\x00b",
        "run": {"id": "run-1", "attempt": 1},
    }
    if hint == "big":
        context |= {
            "big": "a" * 600_000,
            "words": "a " * 300_000,
            "x": list(range(3000)),
            "wide": [{"k": "v" * 100}] * 20_000,
        }
    return context


def assert_safe_message(error: TemplateError) -> None:
    assert error.message
    assert len(error.message) <= 300
    for leak in LEAKS:
        assert leak not in error.message, error.message


def timed_failure(source: str, context: dict[str, Any]) -> tuple[TemplateError, float, float]:
    # The rest of the suite's objects are set aside from the collector first: late in a full run a
    # collection of the whole test process's heap inside the render took 0.52 s of this thread's CPU.
    gc.collect()
    gc.freeze()
    try:
        wall, cpu = time.perf_counter(), time.thread_time()
        with pytest.raises(TemplateError) as info:
            render(source, context)
        return info.value, time.perf_counter() - wall, time.thread_time() - cpu
    finally:
        gc.unfreeze()


ORDERS = {"body": [{"id": 1, "name": "Widget", "price": 9.5}, {"id": 2, "name": "apple", "price": 3}]}
CONTEXT = {
    "orders": ORDERS,
    "inputs": {"since": "2024-03-01T09:30:00+00:00", "customer": "ACME Corp", "empty": [], "zero": 0},
    "run": {"id": "r-1", "attempt": 2, "error": {"code": "TIMEOUT", "message": "too slow"}},
    "flag": True,
    "nothing": None,
}


# -- the hostile corpus ------------------------------------------------------------------------


def test_corpus_is_large_and_well_formed() -> None:
    ids = [case["id"] for case in CORPUS]
    assert len(CORPUS) >= 60
    assert len(ids) == len(set(ids))
    for case in CORPUS:
        assert case["expect"] in ("TEMPLATE_ERROR", "TEMPLATE_LIMIT", "either")
        assert case["context_hint"] in ("empty", "basic", "big")
        assert is_template(case["template"]) or len(case["template"]) > MAX_SOURCE_BYTES


@pytest.mark.parametrize("case", CORPUS, ids=[case["id"] for case in CORPUS])
def test_hostile_template_fails_cleanly_at_render_within_budget(case: dict[str, Any]) -> None:
    # given
    context = context_for(case["context_hint"])
    before = copy.deepcopy(context)
    # when
    error, wall, cpu = timed_failure(case["template"], context)
    # then
    if case["expect"] != "either":
        assert error.code == case["expect"], error.message
    assert error.code == ("TEMPLATE_LIMIT" if isinstance(error, TemplateLimitError) else "TEMPLATE_ERROR")
    assert wall < WALL_LIMIT_SECONDS, wall
    assert cpu < CPU_LIMIT_SECONDS, cpu
    assert_safe_message(error)
    assert context == before  # context objects are read-only to templates


@pytest.mark.parametrize("case", CORPUS, ids=[case["id"] for case in CORPUS])
def test_hostile_template_is_refused_at_save_exactly_when_statically_detectable(case: dict[str, Any]) -> None:
    started = time.perf_counter()
    if case["static"]:
        with pytest.raises(TemplateError) as info:
            validate_template(case["template"])
        assert_safe_message(info.value)
        if case["expect"] != "either":
            assert info.value.code == case["expect"], info.value.message
    else:
        validate_template(case["template"])
    assert time.perf_counter() - started < WALL_LIMIT_SECONDS


def test_runaway_renders_are_stopped_off_the_main_thread_in_parallel() -> None:
    # given: a CPU-bound payload per thread, and a normal render alongside
    runaway = next(case for case in CORPUS if case["id"] == "nested-loops-empty-body")

    def attempt(_: int) -> tuple[str, float, float, bool]:
        assert threading.current_thread() is not threading.main_thread()
        error, wall, cpu = timed_failure(runaway["template"], context_for("big"))
        return error.code, wall, cpu, render("{{ orders.body|length }}", CONTEXT) == 2

    # when
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(attempt, range(4)))
    # then: each was stopped (on its own CPU budget, or by the wall-clock backstop when the
    # threads starve each other of the GIL) and the next render on that thread was unaffected
    for code, wall, cpu, normal_after in results:
        assert code == "TEMPLATE_LIMIT"
        assert wall < WALL_LIMIT_SECONDS
        assert cpu < CPU_LIMIT_SECONDS
        assert normal_after


def test_literal_bombs_neither_hang_nor_allocate_while_compiling() -> None:
    for source in (
        "{{ 'a' * 10**9 }}",
        "{{ 9**(9**9) }}",
        "{{ [1] * 10**9 }}",
        "{{ 'ab'|replace('', 'x' * 9000) }}",
    ):
        tracemalloc.start()
        started = time.perf_counter()
        try:
            validate_template(source)
        except TemplateLimitError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert time.perf_counter() - started < WALL_LIMIT_SECONDS
        assert peak < 5 * 1024 * 1024, (source, peak)


def test_jinja_power_is_left_associative_so_an_unparenthesised_tower_is_small() -> None:
    # Jinja reads 9**9**9 as (9**9)**9 = 9**81, unlike Python: not a bomb, just a number.
    assert render("{{ 9**9**9 }}", {}) == 9**81
    assert render("{{ 10**10**10 }}", {}) == 10**100


def test_output_cap_and_source_cap_are_the_documented_sizes() -> None:
    at_cap = "a" * (MAX_OUTPUT_BYTES - 10)
    assert render("{{ s }}..........", {"s": at_cap}) == at_cap + ".........."
    with pytest.raises(TemplateLimitError):
        render("{{ s }}...........", {"s": at_cap})
    validate_template("{{ s }}" + " " * (MAX_SOURCE_BYTES - 7))
    with pytest.raises(TemplateLimitError):
        validate_template("{{ s }}" + " " * (MAX_SOURCE_BYTES - 6))


def test_mutating_a_context_list_is_refused_and_leaves_it_intact() -> None:
    items = [1, 2]
    with pytest.raises(TemplateError, match="forbidden attribute 'append'"):
        render("{{ items.append(3) }}", {"items": items})
    assert items == [1, 2]


def test_native_result_is_a_copy_not_the_context_object() -> None:
    result = render("{{ orders.body }}", {"orders": copy.deepcopy(ORDERS)})
    assert result == ORDERS["body"]
    result[0]["name"] = "changed"
    assert ORDERS["body"][0]["name"] == "Widget"


# -- rendering ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ orders.body }}", ORDERS["body"]),
        ("{{ orders.body[0] }}", ORDERS["body"][0]),
        ("{{ orders.body | length }}", 2),
        ("{{ orders.body | length > 0 }}", True),
        ("{{ nothing }}", None),
        ("{{ orders.body[0].price }}", 9.5),
        ("{{ inputs.customer }}", "ACME Corp"),
        ("{{ (1, 2) }}", [1, 2]),
        ("{{ {'a': [1, none]} }}", {"a": [1, None]}),
        ("{{- inputs.zero -}}", 0),
    ],
)
def test_exactly_one_expression_keeps_its_native_type(source: str, expected: Any) -> None:
    result = render(source, CONTEXT)
    assert result == expected
    assert type(result) is type(expected)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "{{ orders.body|length }} orders since {{ inputs.since }}",
            "2 orders since 2024-03-01T09:30:00+00:00",
        ),
        ("items: {{ orders.body[0] }}", 'items: {"id": 1, "name": "Widget", "price": 9.5}'),
        ("{{ nothing }} {{ flag }} {{ inputs.empty }}", "null true []"),
        ("{{ 'a' ~ orders.body[0].id ~ nothing }}", "a1null"),
        (" {{ inputs.zero }}", " 0"),
        ("{{ inputs.customer }}\n", "ACME Corp\n"),
        (
            "{% for o in orders.body %}{{ loop.index }}:{{ o.name }}{{ ',' if not loop.last else '' }}{% endfor %}",
            "1:Widget,2:apple",
        ),
        ("{% for o in orders.body if o.price > 5 %}{{ o.name }}{% else %}none{% endfor %}", "Widget"),
        ("{% set total = orders.body[0].price + orders.body[1].price %}{{ total }}", "12.5"),
        ("{% macro tag(v) %}<{{ v }}>{% endmacro %}{{ tag('x') }}{{ tag(1) }}", "<x><1>"),
        ("{% raw %}{{ ''.__class__ }}{% endraw %}", "{{ ''.__class__ }}"),
        ("{# a comment #}{{ inputs.customer }}", "ACME Corp"),
        ("{{ '%.2f' % orders.body[0].price }} {{ '%s-%03d' % ('a', 7) }}", "9.50 a-007"),
        ("{{ 7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ -3 }} {{ 1 / 4 }}", "3 1 1024 -3 0.25"),
        ("{% for k, v in run.error.items() %}{{ k }}={{ v }};{% endfor %}", "code=TIMEOUT;message=too slow;"),
        ("{{ run.error.get('code') }} {{ run.get('nope', 'dflt') }}", "TIMEOUT dflt"),
        ("{{ inputs.customer.split(' ')[0] }} {{ inputs.customer.startswith('AC') }}", "ACME true"),
        ("{{ 'é' ~ '✓' }}", "é✓"),
    ],
)
def test_mixed_text_renders_non_strings_as_json(source: str, expected: str) -> None:
    assert render(source, CONTEXT) == expected


def test_a_mapping_key_wins_over_a_dict_method_of_the_same_name() -> None:
    assert render("{{ order.items }}", {"order": {"items": [1, 2]}}) == [1, 2]


def test_plain_strings_are_returned_untouched_even_when_long() -> None:
    long_text = "no template here " * 1000
    assert render(long_text, {}) == long_text
    assert render("", {}) == ""
    assert render("{ not a template }", {}) == "{ not a template }"


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("{{ foo }}", "undefined variable 'foo'"),
        ("{{ orders.nope }}", "undefined attribute 'nope'"),
        ("{{ orders.body[7] }}", "undefined item 7"),
        ("{{ foo.bar }}", "undefined variable 'foo'"),
        ("{{ foo ~ 'x' }}", "undefined variable 'foo'"),
        ("{% for x in foo %}{% endfor %}", "undefined variable 'foo'"),
        ("{{ foo|upper }}", "undefined variable 'foo'"),
        ("{{ inputs.empty|first }}", "first: the sequence is empty"),
        (
            "{{ inputs.until }}",
            "input 'until' is not defined: the run was not given it and the automation's "
            "input schema has no default for it",
        ),
        (
            "x={{ inputs['until'] }}",
            "input 'until' is not defined: the run was not given it and the "
            "automation's input schema has no default for it",
        ),
    ],
)
def test_strict_undefined_names_what_is_missing(source: str, message: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(source, CONTEXT)
    assert info.value.code == "TEMPLATE_ERROR"
    assert info.value.message == message


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("{{ x|attr('a') }}", "filter 'attr' is not allowed"),
        ("{{ x is callable }}", "test 'callable' is not allowed"),
        ("{{ x.__class__ }}", "forbidden attribute '__class__'"),
        ("hello {{ x", "syntax error on line 1"),
        ("a\n{% if %}", "syntax error on line 2"),
        ("{% include 'x' %}", "not available"),
        ("{{ range(3) }}", "name 'range' is not available"),
    ],
)
def test_validation_errors_are_specific(source: str, fragment: str) -> None:
    with pytest.raises(TemplateError) as info:
        validate_template(source)
    assert fragment in info.value.message
    assert info.value.code == "TEMPLATE_ERROR"


def test_render_budget_is_reported_as_a_limit() -> None:
    error, wall, cpu = timed_failure(
        "{% for a in x %}{% for b in x %}{% endfor %}{% endfor %}", {"x": list(range(5000))}
    )
    assert error.code == "TEMPLATE_LIMIT"
    assert error.message == "template render exceeded 100 ms"
    assert cpu >= RENDER_BUDGET_SECONDS * 0.9 or wall >= WALL_BACKSTOP_SECONDS  # backstop on a starved CPU


def test_a_normal_render_is_fast() -> None:
    source = "{% for o in orders.body %}{{ o.name|upper }} {{ '%.2f' % o.price }};{% endfor %} {{ inputs.since|date }}"
    render(source, CONTEXT)  # compiles and caches
    started = time.perf_counter()
    for _ in range(200):
        render(source, CONTEXT)
    assert (time.perf_counter() - started) / 200 < 0.005


# -- filters and tests ---------------------------------------------------------------------------


def test_the_allowed_lists_are_exactly_the_spec() -> None:
    spec_filters = (
        "join length default upper lower truncate tojson date replace trim slugify first last sort reverse"
    )
    assert ALLOWED_FILTERS == {*spec_filters.split(), "abs", "round", "int", "float", "string", "d"}
    assert ALLOWED_TESTS == {"defined", "none", "number", "string", "mapping", "sequence", "boolean"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ ['a', 1, none]|join(', ') }}", "a, 1, null"),
        ("{{ 'abc'|length }} {{ {'a': 1}|length }}", "3 1"),
        ("{{ missing|default('dflt') }}", "dflt"),
        ("{{ missing|d('dflt') }}", "dflt"),
        ("{{ ''|default('dflt', true) }}", "dflt"),
        ("{{ inputs.customer|upper }} {{ inputs.customer|lower }}", "ACME CORP acme corp"),
        ("{{ 'hello world foo bar'|truncate(14, leeway=0) }}", "hello..."),
        ("{{ 'hello world foo bar'|truncate(14) }}", "hello world foo bar"),
        ("{{ 'hello world foo bar'|truncate(9, true, '!') }}", "hello wo!"),
        ("{{ 'short'|truncate(10) }}", "short"),
        ("{{ orders.body[0]|tojson }}", '{"id": 1, "name": "Widget", "price": 9.5}'),
        ("{{ 'x'|tojson }}", '"x"'),
        ("{{ inputs.since|date }}", "2024-03-01"),
        ("{{ inputs.since|date('%d %b %Y %H:%M') }}", "01 Mar 2024 09:30"),
        ("{{ '2024-03-01T09:30:00Z'|date('%H:%M %z') }}", "09:30 +0000"),
        ("{{ 0|date('%Y-%m-%dT%H:%M:%S%z') }}", "1970-01-01T00:00:00+0000"),
        ("{{ 'a-b-c'|replace('-', '+') }} {{ 'a-b-c'|replace('-', '', 1) }}", "a+b+c ab-c"),
        ("{{ '  x  '|trim }}|{{ '--x--'|trim('-') }}", "x|x"),
        ("{{ 'Héllo, Wörld! Ünïcode — ok'|slugify }}", "hello-world-unicode-ok"),
        ("{{ [3, 1, 2]|first }} {{ [3, 1, 2]|last }} {{ 'abc'|first }} {{ 'abc'|last }}", "3 2 a c"),
        ("{{ inputs.empty|first|default('none') }}", "none"),
        ("{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }}", "[1, 2, 3] [3, 2, 1]"),
        (
            "{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }}",
            '["A", "b", "c"] ["A", "b", "c"]',
        ),
        ("{{ (orders.body|sort(attribute='name'))[0].name }}", "apple"),
        ("{{ [1, 2, 3]|reverse }} {{ 'abc'|reverse }}", "[3, 2, 1] cba"),
        ("{{ -3|abs }} {{ (-2.5)|abs }}", "3 2.5"),
        ("{{ 2.567|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(0, 'floor') }}", "2.57 3.0 2.0"),
        (
            "{{ '42'|int + 1 }} {{ '4.7'|int }} {{ 'x'|int }} {{ 'x'|int(-1) }} {{ 'ff'|int(0, 16) }}",
            "43 4 0 -1 255",
        ),
        ("{{ '2.5'|float * 2 }} {{ 'x'|float }}", "5.0 0.0"),
        ("{{ 1|string ~ none|string }} {{ {'a': 1}|string }}", '1null {"a": 1}'),
        (
            "{{ 1 is number }} {{ 'a' is string }} {{ {} is mapping }} {{ [] is sequence }}",
            "true true true true",
        ),
        ("{{ missing is defined }} {{ nothing is none }} {{ flag is boolean }}", "false true true"),
    ],
)
def test_filters_and_tests(source: str, expected: str) -> None:
    assert render(source, CONTEXT) == expected


def test_date_accepts_datetime_objects() -> None:
    when = datetime(2024, 5, 6, 7, 8, tzinfo=UTC)
    assert render("{{ when|date('%Y/%m/%d %H:%M') }}", {"when": when}) == "2024/05/06 07:08"
    assert render("{{ when }}", {"when": when}) == "2024-05-06T07:08:00+00:00"


@pytest.mark.parametrize(
    "source",
    [
        "{{ 'x'|date }}",
        "{{ inputs.since|date('%Q') }}",
        "{{ [1, 'a']|sort }}",
        "{{ 'a'|truncate(1) }}",
        "{{ 1/0 }}",
    ],
)
def test_filter_misuse_is_a_template_error(source: str) -> None:
    with pytest.raises(TemplateError) as info:
        render(source, CONTEXT)
    assert info.value.code == "TEMPLATE_ERROR"
    assert_safe_message(info.value)


def test_a_type_mismatch_names_the_operator_and_the_json_types() -> None:
    with pytest.raises(TemplateError) as info:
        render("{{ inputs.customer - 1 }}", CONTEXT)
    assert info.value.message == "cannot apply - to text and number"
    with pytest.raises(TemplateError) as info:
        render("{{ orders + [1] }}", CONTEXT)
    assert info.value.message == "cannot apply + to object and list"


# -- predicates, structures, pointers ------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("{{ orders.body | length > 0 }}", True),
        ("{{ inputs.empty }}", False),
        ("{{ inputs.zero }}", False),
        ("{{ nothing }}", False),
        ("{{ orders }}", True),
        ("{{ 'false' }}", False),
        ("{{ 'False' }}", False),
        ("{{ '0' }}", False),
        ("{{ '' }}", False),
        ("{{ flag }} ", True),
        ("{{ not flag }} ", False),
        ("{% if flag %}yes{% endif %}", True),
        ("{% if not flag %}yes{% endif %}", False),
        ("true", True),
        ("false", False),
    ],
)
def test_when_predicates(source: str, expected: bool) -> None:
    assert evaluate_predicate(source, CONTEXT) is expected


def test_predicate_errors_are_template_errors() -> None:
    with pytest.raises(TemplateError):
        evaluate_predicate("{{ missing > 1 }}", CONTEXT)


def test_render_value_renders_every_string_and_leaves_keys_and_other_values() -> None:
    config = {
        "url": "https://api.example.com/orders?since={{ inputs.since }}",
        "json": {"items": "{{ orders.body }}", "count": "{{ orders.body|length }}", "{{ key }}": 1},
        "list": ["{{ flag }}", 2, None, ["x {{ run.attempt }}"]],
        "timeout": 20,
        "plain": "text",
    }
    assert render_value(config, CONTEXT) == {
        "url": "https://api.example.com/orders?since=2024-03-01T09:30:00+00:00",
        "json": {"items": ORDERS["body"], "count": 2, "{{ key }}": 1},
        "list": [True, 2, None, ["x 2"]],
        "timeout": 20,
        "plain": "text",
    }


def test_render_value_refuses_pathologically_deep_structures() -> None:
    deep: Any = "{{ flag }}"
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(TemplateLimitError):
        render_value(deep, CONTEXT)


def test_iter_templates_yields_json_pointers_in_document_order() -> None:
    definition = {
        "plan": [
            {"step_id": "fetch", "config": {"url": "https://x/{{ inputs.a }}", "method": "GET"}},
            {"when": "{{ flag }}", "config": {"a/b": "{{ x }}", "m~n": ["plain", "{% if x %}y{% endif %}"]}},
        ],
        "goal": "no template",
        "comment": "{# c #}",
    }
    assert list(iter_templates(definition)) == [
        ("/plan/0/config/url", "https://x/{{ inputs.a }}"),
        ("/plan/1/when", "{{ flag }}"),
        ("/plan/1/config/a~1b", "{{ x }}"),
        ("/plan/1/config/m~0n/1", "{% if x %}y{% endif %}"),
        ("/comment", "{# c #}"),
    ]
    assert list(iter_templates(["{{ a }}"], "/execution/on_failure")) == [
        ("/execution/on_failure/0", "{{ a }}")
    ]
    assert list(iter_templates("{{ a }}")) == [("", "{{ a }}")]
    assert list(iter_templates(42)) == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("{{ x }}", True),
        ("a {% if x %}", True),
        ("{# c #}", True),
        ("plain", False),
        ("{ x }", False),
        (3, False),
    ],
)
def test_is_template(value: Any, expected: bool) -> None:
    assert is_template(value) is expected


def test_errors_carry_stable_codes() -> None:
    assert TemplateError("x").code == "TEMPLATE_ERROR"
    assert TemplateLimitError("x").code == "TEMPLATE_LIMIT"
    assert issubclass(TemplateLimitError, TemplateError)
    with pytest.raises(TemplateError, match="must be text"):
        validate_template(None)  # type: ignore[arg-type]
