"""The engine asks an action's definition, never its name (issue 10): no engine module compares
an action name with a literal."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from capabilities import registry

REPO = Path(__file__).resolve().parents[2]
ENGINE = [*sorted((REPO / "automations").rglob("*.py")), *sorted((REPO / "approvals").rglob("*.py")),
          REPO / "capabilities" / "tools.py"]  # fmt: skip


def _name_literals(path: Path) -> list[str]:
    """Action names written as literals in comparisons and membership tests (``in ("a", "b")``)."""
    names = set(registry.action_names())
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in list(operands):
            if isinstance(operand, ast.Tuple | ast.List | ast.Set):
                operands.extend(operand.elts)
        for operand in operands:
            if isinstance(operand, ast.Constant) and operand.value in names:
                found.append(f"{path.relative_to(REPO)}:{operand.lineno}: {operand.value!r}")
    return found


@pytest.mark.parametrize("path", [p for p in ENGINE if "migrations" not in p.parts], ids=lambda p: p.name)
def test_no_engine_module_compares_action_names(path):
    assert _name_literals(path) == []


def test_the_check_finds_a_comparison():
    probe = REPO / "var" / "probe_action_contract.py"
    probe.parent.mkdir(exist_ok=True)
    probe.write_text('def f(step):\n    return step["action"] == "http_request" or step in ("run_shell",)\n')
    try:
        assert len(_name_literals(probe)) == 2
    finally:
        probe.unlink()


def test_what_the_engine_asked_by_name_is_declared_on_the_definitions():
    actions = {a.name: a for a in registry.all_actions()}
    assert {n for n, a in actions.items() if a.credentials_to_code} == {"run_python", "run_shell"}
    assert {n for n, a in actions.items() if a.credential_destination} == {"http_request"}
    assert {n for n, a in actions.items() if a.as_tool} == {"http_request", "send_email", "emit_event"}
    assert {n for n, a in actions.items() if a.model_driven} == {"agent_task"}
    assert {n for n, a in actions.items() if a.always_asks_human} == {"require_approval", "ask_human"}
    assert actions["call_capability"].uses({"capability": "core.echo"}) == ["core.echo"]
