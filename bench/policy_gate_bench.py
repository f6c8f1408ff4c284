"""What the gate's policies cost per gated step (issue 29): thread CPU time of the gate decision
(``gate_policies.assess`` + ``gating.decision_for``) with no policies and with 20 workspace rules that
do not match, against the decision alone (the gate before policies existed).

    uv run python -m bench.policy_gate_bench [iterations]

In-process, no database: a step that no rule matches writes nothing (only a match is audited) and
names no credential (only then is the credential table read). The step is an ``http_request`` POST
with a JSON body; the 20 rules are numeric ranges, allowlists, prefixes and regexes over its
fields, some on paths it lacks. Target: <= 0.2 ms per gated step with 20 rules.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable

import django

ITERATIONS = 20_000
REPEATS = 5


def twenty_rules() -> list[dict]:
    rules: list[dict] = []
    for i in range(5):
        rules.append(
            {"when": {"path": "json.amount", "gt": 10_000 + i}, "then": "block", "reason": f"cap {i}"}
        )
        rules.append({"when": {"path": "json.currency", "in": ["XBT", "XAU", f"X{i}"]}, "then": "ask",
                      "reason": f"odd currency {i}"})  # fmt: skip
        rules.append({"when": {"$and": [{"path": "method", "equals": "DELETE"},
                                        {"path": "url", "starts_with": f"https://bank{i}.example/"}]},
                      "then": "block", "reason": f"no deletes at bank {i}"})  # fmt: skip
        rules.append({"when": {"path": f"json.customer.tier{i}", "regex": "^(vip|staff)$"}, "then": "ask",
                      "reason": f"absent path {i}"})  # fmt: skip
    return rules


def main(iterations: int = ITERATIONS) -> dict[str, float]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    from automations import gate_policies, gating
    from automations.models import Run
    from automations.steps import PreparedStep, risk_for
    from capabilities import registry
    from workspaces.models import Workspace

    action = registry.get_action("http_request")
    assert action is not None
    config = {"method": "POST", "url": "https://pay.example/refunds",
              "json": {"amount": 20, "currency": "EUR", "customer": {"id": "c-1"}}}  # fmt: skip
    capability = action.describe(config)
    risk, reasons = risk_for(action, config, capability)
    step = {"step_id": "refund", "action": "http_request", "config": config}
    prepared = PreparedStep(
        step=step, action=action, config=config, capability=capability, risk=risk, reasons=reasons
    )

    def run_with(rules: list[dict]) -> Run:
        run = Run(workspace_id=1, trace_id="bench")
        run.workspace = Workspace(id=1, slug="bench", policies=rules, quiet_hours=None)
        return run

    bare, none, twenty = run_with([]), run_with([]), run_with(twenty_rules())
    assert gate_policies.assess(twenty, prepared).decision is None  # no rule matches this step

    def before() -> None:  # the gate's decision as it was: the matrix alone
        gating.decision_for(prepared, "A3")

    def with_policies(run: Run) -> Callable[[], None]:
        def once() -> None:
            gating.decision_for(prepared, "A3", gate_policies.assess(run, prepared).decision)

        return once

    cases = {
        "matrix only (before)": before,
        "0 policies": with_policies(none),
        "20 policies": with_policies(twenty),
    }
    del bare
    results: dict[str, float] = {}
    for name, call in cases.items():
        samples = []
        for _ in range(REPEATS):
            start = time.thread_time()
            for _ in range(iterations):
                call()
            samples.append((time.thread_time() - start) / iterations * 1e6)
        results[name] = statistics.median(samples)
        print(
            f"{name:>22}: {results[name]:8.2f} us thread CPU per gated step "  # noqa: T201
            f"(median of {REPEATS} x {iterations}; min {min(samples):.2f})"
        )
    return results


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else ITERATIONS)
