"""Argument policies (issue 29): ordered rules over a step's rendered config. Pure: no Django.

A rule is ``{"when": <filter>, "then": "auto" | "ask" | "block", "reason": "..."}``. ``when`` is a
filter in the event-filter grammar (:mod:`.filter_grammar`), evaluated over the step's rendered
config itself: an ``http_request`` JSON body field is ``json.amount``, a header
``headers.X-Env``. Rules are tried in order and the first whose ``when`` is true decides; a rule
on a path the config does not have simply does not match.

``then``: ``auto`` adds nothing (the autonomy x risk matrix decides, as without policies: a rule
never lowers the gate), ``ask`` forces a human approval, ``block`` fails the step
``POLICY_VIOLATION`` before any call. A workspace's rules and a step's own ``policy`` are each
tried; where both match, the stricter wins (block > ask > auto), so a step's ``auto`` cannot lift
its workspace's ``ask`` or ``block`` -- authors may only tighten.

Compiling costs far more than evaluating, so compiled rule lists are cached by their canonical
JSON (:func:`compiled`): a worker compiles a workspace's rules once, whatever the number of runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .filter_grammar import CompiledFilter, FilterBudgetExceeded, compile_filter, validate_filter

THEN = ("auto", "ask", "block")
STRICTNESS = {"auto": 0, "ask": 1, "block": 2}
MAX_RULES = 100
MAX_REASON_LENGTH = 500
_KEYS = frozenset({"when", "then", "reason"})


@dataclass(frozen=True)
class Rule:
    index: int
    when: CompiledFilter | None  # None: the stored rule is invalid, and it always matches
    then: str
    reason: str


@dataclass(frozen=True)
class Match:
    source: str  # "workspace" | "step"
    index: int  # the rule's place in its list, from 0
    then: str
    reason: str
    # The rule's evaluation ran out of its CPU budget: it counts as matched, at least "ask".
    over_budget: bool = False


def label(pointer: str) -> str:
    """``/plan/0/policy/2/when`` as people write it: ``plan[0].policy[2].when``."""
    text = ""
    for part in pointer.strip("/").split("/"):
        text += f"[{part}]" if part.isdigit() else (f".{part}" if text else part)
    return text


def rule_issues(rules: Any, pointer: str) -> list[dict[str, str]]:
    """Every problem with a rule list stored at ``pointer`` (``/policies``, ``/plan/0/policy``), as
    ``{path, code, message}`` with a JSON-pointer path; the message starts with the dotted path of the
    bad rule (``policies[2].when: ...``). An empty list: the rules may be saved."""
    issues: list[dict[str, str]] = []

    def add(path: str, code: str, message: str) -> None:
        issues.append({"path": path, "code": code, "message": f"{label(path)}: {message}"})

    if not isinstance(rules, list):
        add(pointer, "invalid_policy", "a list of rules {when, then, reason}")
        return issues
    if len(rules) > MAX_RULES:
        add(pointer, "invalid_policy", f"at most {MAX_RULES} rules")
        return issues
    for i, rule in enumerate(rules):
        at = f"{pointer}/{i}"
        if not isinstance(rule, dict):
            add(at, "invalid_policy", "a rule is an object {when, then, reason}")
            continue
        unknown = sorted(map(str, set(rule) - _KEYS))
        if unknown:
            add(
                at,
                "invalid_policy",
                f"unknown key(s): {', '.join(unknown)[:200]}; a rule has when, then, reason",
            )
        if "when" not in rule:
            add(f"{at}/when", "invalid_policy", "missing: a filter over the step's rendered config")
        else:
            for issue in validate_filter(rule["when"]):
                add(f"{at}/when{issue.path}", issue.code, issue.message)
        if rule.get("then") not in THEN:
            add(f"{at}/then", "invalid_policy", "one of auto, ask, block")
        reason = rule.get("reason", "")
        if not isinstance(reason, str) or len(reason) > MAX_REASON_LENGTH:
            add(f"{at}/reason", "invalid_policy", f"text of at most {MAX_REASON_LENGTH} characters")
    return issues


def workspace_rule_issues(rules: Any) -> list[dict[str, str]]:
    return rule_issues(rules, "/policies")


def compiled(rules: list[Any]) -> tuple[Rule, ...]:
    """The rules ready to evaluate (valid rules only: they were checked when saved). Cached."""
    if not rules:
        return ()
    return _compiled(json.dumps(rules, sort_keys=True, separators=(",", ":")))


@lru_cache(maxsize=512)
def _compiled(text: str) -> tuple[Rule, ...]:
    out = []
    for i, rule in enumerate(json.loads(text)):
        if rule_issues([rule], "/rule"):
            # Checked when saved, so only a rule written around the API (or one an older grammar
            # accepted) gets here: it fails closed, blocking until an admin fixes it.
            out.append(
                Rule(i, None, "block", f"rule {i + 1} is invalid and blocks every step until it is fixed")
            )
            continue
        reason = rule.get("reason") or f"rule {i + 1}"
        out.append(Rule(i, compile_filter(rule["when"]), rule["then"], reason))
    return tuple(out)


def first_match(rules: tuple[Rule, ...], config: Any, source: str) -> Match | None:
    """The first rule whose ``when`` holds for ``config``; a rule that cannot finish within its CPU
    budget counts as matched and asks at least (fails closed, never open)."""
    for rule in rules:
        try:
            if rule.when is None or rule.when.matches(config):
                return Match(source, rule.index, rule.then, rule.reason)
        except FilterBudgetExceeded:
            return Match(source, rule.index, stricter_of(rule.then, "ask"), rule.reason, over_budget=True)
    return None


def stricter_of(a: str, b: str) -> str:
    return a if STRICTNESS[a] >= STRICTNESS[b] else b


def deciding(workspace: Match | None, step: Match | None) -> Match | None:
    """The match that decides: the workspace's, unless the step's own is stricter."""
    if workspace is None or step is None:
        return workspace or step
    return step if STRICTNESS[step.then] > STRICTNESS[workspace.then] else workspace
