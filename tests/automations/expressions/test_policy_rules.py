"""Argument policy rules (automations/expressions/policy_rules.py): checked at save with the path of
the bad rule, evaluated over a rendered config, first match wins, the stricter of workspace and step
decides. Pure: no database."""

from __future__ import annotations

import pytest

from automations.expressions import policy_rules
from automations.expressions.policy_rules import Match, compiled, deciding, first_match, rule_issues

REFUNDS = [
    {"when": {"path": "json.amount", "lte": 50}, "then": "auto", "reason": "small refunds run"},
    {"when": {"path": "json.amount", "lte": 500}, "then": "ask", "reason": "refunds up to 500 ask"},
    # Not "gt 500": an amount that is over 500 *or not a number at all* ("900" as text) is blocked.
    {
        "when": {"path": "json.amount", "exists": True},
        "then": "block",
        "reason": "refunds over 500 are blocked",
    },
]


def refund(amount) -> dict:
    return {"method": "POST", "url": "https://pay.example/refunds", "json": {"amount": amount}}


@pytest.mark.parametrize(
    ("amount", "then", "rule"),
    [
        (0, "auto", 0),
        (50, "auto", 0),
        (50.01, "ask", 1),
        (500, "ask", 1),
        (500.5, "block", 2),
        (10**9, "block", 2),
    ],
)
def test_the_refund_example_runs_up_to_50_asks_up_to_500_and_blocks_above(amount, then, rule):
    match = first_match(compiled(REFUNDS), refund(amount), "workspace")

    assert match is not None
    assert (match.then, match.index) == (then, rule)


@pytest.mark.parametrize("amount", ["9999", "10", None, [1], {"value": 10}, True])
def test_a_refund_amount_that_is_not_a_number_is_blocked_by_the_last_rule(amount):
    match = first_match(compiled(REFUNDS), refund(amount), "workspace")
    assert (match.index, match.then) == (2, "block")  # no range matches text: the catch-all blocks it


def test_a_string_allowlist_is_expressible():
    rules = [
        {"when": {"path": "json.currency", "in": ["EUR", "USD"]}, "then": "auto", "reason": "known currency"},
        {"when": {"path": "json.currency", "exists": True}, "then": "block", "reason": "unknown currency"},
    ]
    assert first_match(compiled(rules), {"json": {"currency": "EUR"}}, "workspace").then == "auto"
    assert first_match(compiled(rules), {"json": {"currency": "XBT"}}, "workspace").then == "block"


def test_a_rule_on_an_absent_path_does_not_match():
    rules = [{"when": {"path": "json.amount", "gt": 0}, "then": "block", "reason": "r"}]

    assert first_match(compiled(rules), {"method": "GET", "url": "https://x.example"}, "workspace") is None
    assert first_match(compiled(rules), {"json": "not an object"}, "workspace") is None


def test_the_first_matching_rule_wins():
    rules = [
        {"when": {"path": "method", "equals": "DELETE"}, "then": "ask", "reason": "deletes ask"},
        {"when": {"path": "method", "equals": "DELETE"}, "then": "block", "reason": "never reached"},
    ]
    assert first_match(compiled(rules), {"method": "DELETE"}, "workspace").reason == "deletes ask"


def test_a_rule_without_a_reason_is_named_by_its_place():
    rules = [{"when": {"path": "method", "equals": "PUT"}, "then": "ask"}]
    assert first_match(compiled(rules), {"method": "PUT"}, "workspace").reason == "rule 1"


def _m(source: str, then: str) -> Match:
    return Match(source, 0, then, then)


@pytest.mark.parametrize(
    ("workspace", "step", "winner"),
    [
        ("ask", "auto", "workspace"),  # a step's auto cannot lift the workspace's ask
        ("block", "auto", "workspace"),
        ("block", "ask", "workspace"),
        ("auto", "ask", "step"),  # the step may tighten
        ("ask", "block", "step"),
        ("ask", "ask", "workspace"),
    ],
)
def test_the_workspace_match_decides_unless_the_step_is_stricter(workspace, step, winner):
    found, own = _m("workspace", workspace), _m("step", step)
    assert deciding(found, own).source == winner
    assert deciding(None, own) is own
    assert deciding(found, None) is found
    assert deciding(None, None) is None


def test_compiled_rules_are_cached_by_their_json():
    same = [dict(rule) for rule in REFUNDS]
    assert compiled(REFUNDS) is compiled(same)
    assert compiled([]) == ()


@pytest.mark.parametrize(
    ("rules", "path", "code"),
    [
        ("block", "/policies", "invalid_policy"),
        ([{"when": {"path": "a", "gt": 1}, "then": "auto"}, "x"], "/policies/1", "invalid_policy"),
        ([{"then": "ask"}], "/policies/0/when", "invalid_policy"),
        ([{"when": {"path": "a", "gt": 1}, "then": "allow"}], "/policies/0/then", "invalid_policy"),
        ([{"when": {"path": "a", "gt": 1}, "then": "ask", "reason": 5}], "/policies/0/reason", "invalid_policy"),
        ([{"when": {"path": "a", "gt": 1}, "then": "ask", "extra": 1}], "/policies/0", "invalid_policy"),
        ([{"when": {"path": "a", "gt": 1}, "then": "ask"}] * 2 + [{"when": {"path": "a"}, "then": "ask"}],
         "/policies/2/when", "invalid_filter"),
        ([{"when": {"path": "a", "regex": "(a)\\1"}, "then": "ask"}], "/policies/0/when/regex", "invalid_regex"),
        ([{"when": {"$and": [{"path": "a", "lt": True}]}, "then": "ask"}], "/policies/0/when/$and/0/lt",
         "invalid_filter"),
        ([{"when": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"$not": {"path": "a", "exists": True}}}}}}}}},
           "then": "ask"}], "/policies/0/when/$not/$not/$not/$not/$not/$not/$not/$not", "filter_too_deep"),
        ([{"when": {"path": "a", "gt": 1}, "then": "ask"}] * (policy_rules.MAX_RULES + 1), "/policies", "invalid_policy"),
    ],
)  # fmt: skip
def test_a_malformed_rule_is_reported_at_the_path_of_the_bad_rule(rules, path, code):
    issues = rule_issues(rules, "/policies")

    assert issues, rules
    assert (issues[0]["path"], issues[0]["code"]) == (path, code)
    assert issues[0]["message"].startswith(policy_rules.label(path) + ": ")


def test_the_path_of_a_bad_rule_reads_as_people_write_it():
    issues = rule_issues([*REFUNDS[:2], {"when": {"path": "json.amount", "gt": "5", "lt": 7}, "then": "ask"}],
                         "/policies")  # fmt: skip
    assert [issue["path"] for issue in issues] == ["/policies/2/when"]
    assert issues[0]["message"].startswith("policies[2].when: ")
    assert policy_rules.label("/plan/0/policy/1/then") == "plan[0].policy[1].then"


def test_valid_rules_have_no_issues():
    assert rule_issues(REFUNDS, "/policies") == []
    assert rule_issues([], "/policies") == []


@pytest.mark.parametrize(
    "stored",
    [{"when": {"path": "a", "between": [1, 2]}, "then": "auto"}, {"when": {"path": "a", "gt": 1}, "then": "allow"},
     "not a rule"],
)  # fmt: skip
def test_a_stored_rule_that_is_invalid_fails_closed(stored):
    """Rules are checked when saved; one written around the API blocks rather than lets through."""
    match = first_match(compiled([stored, REFUNDS[0]]), refund(10), "workspace")

    assert (match.index, match.then) == (0, "block")
    assert "invalid" in match.reason
