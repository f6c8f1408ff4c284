"""Structure: the engine's modules form no import cycle, and only Celery imports automations/tasks.py.

Module-level imports are read from the source (ast), so a cycle hidden by a
function-local import is caught too: such imports are forbidden outside
``AppConfig.ready`` and management commands.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ["audit", "workspaces", "capabilities", "approvals", "automations", "triggers", "ops"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(app: str) -> dict[str, Path]:
    return {
        _module_name(p): p
        for p in (ROOT / app).rglob("*.py")
        if "migrations" not in p.parts and "management" not in p.parts
    }


def _imports(module: str, path: Path) -> tuple[set[str], list[int]]:
    """Modules imported at module level, and the lines of imports inside functions."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    local: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
            found.update(names)
    for func in ast.walk(tree):
        if isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef) and func.name != "ready":
            local += [n.lineno for n in ast.walk(func) if isinstance(n, ast.Import | ast.ImportFrom)]
    return found, local


def _graph(app: str) -> dict[str, set[str]]:
    modules = _sources(app)
    return {m: {i for i in _imports(m, p)[0] if i in modules and i != m} for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_engine_modules():
    cycle = _cycle(_graph("automations"))

    assert cycle is None, " -> ".join(cycle or [])


def test_nothing_imports_the_celery_tasks_module():
    importers = [
        m for app in APPS for m, p in _sources(app).items()
        if "automations.tasks" in _imports(m, p)[0] and m != "automations.tasks"
    ]  # fmt: skip

    assert importers == []


# Not a cycle being hidden: the sandbox runner also works without Django configured.
OPTIONAL = {"capabilities.sandbox"}


@pytest.mark.parametrize("app", ["automations", "approvals", "capabilities", "triggers", "audit"])
def test_no_function_local_imports(app):
    local = {m: lines for m, p in _sources(app).items() if (lines := _imports(m, p)[1]) and m not in OPTIONAL}

    assert local == {}


def test_starting_django_does_not_import_the_mcp_sdk():
    """Importing ``mcp`` costs ~1.5 s per process; only an MCP call or harvest loads it
    (``capabilities.mcp_client._sdk``)."""
    code = (
        "import sys, django; django.setup(); "
        "import config.celery, config.urls; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mcp', 'mcp_types') "
        "or m == 'capabilities.mcp_sdk'))"
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300, check=True)  # fmt: skip

    assert result.stdout.strip() == "[]"


LANES = {
    # Nothing connects while Django starts: these URLs are only read.
    "embedded": {},
    "redis": {
        "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/ap_import_check",
        "CELERY_BROKER_URL": "redis://127.0.0.1:6379/0",
    },
}


@pytest.mark.parametrize(
    ("lane", "unwanted"), [("embedded", ("redis", "sqlalchemy")), ("redis", ("sqlalchemy",))]
)
def test_starting_django_does_not_import_another_lanes_broker_client(lane, unwanted, tmp_path):
    """Every process of ``up`` starts Django: the settings load no broker client (kombu imports
    the transport on the first connection, config.embedded_broker on the embedded lane), and
    ``redis`` is loaded by the webhook rate limit only on the Redis lane (triggers.rate_limit_redis)."""
    code = (
        "import sys, django; django.setup(); "
        "import config.celery, config.urls; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {unwanted!r} "
        "or m in ('config.embedded_broker', 'config.redis_direct', 'triggers.rate_limit_redis')))"
    )
    keep = {k: v for k, v in os.environ.items() if k not in (
        "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND", "AUTOPLANE_RATE_LIMIT_REDIS_URL"
    )}  # fmt: skip
    env = {
        **keep,
        **LANES[lane],
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "AUTOPLANE_DATA_DIR": str(tmp_path),
    }
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                            timeout=300, check=True)  # fmt: skip

    assert result.stdout.strip() == "[]"


# --- the README's dependency graph is the real one ---------------------------------------

GRAPH_APPS = [
    "audit",
    "workspaces",
    "capabilities",
    "approvals",
    "notifications",
    "automations",
    "triggers",
    "ops",
    "mcpserver",
    "bench",
]


def _readme_edges(names: set[str]) -> dict[str, set[str]]:
    """The README's ``name → a, b (comment)`` lines whose names are among ``names``."""
    edges: dict[str, set[str]] = {}
    for line in (ROOT / "README.md").read_text().splitlines():
        found = re.match(r"^([a-z_, ]+?)\s+→\s+(.*)$", line)
        if not found:
            continue
        heads = {head.strip() for head in found.group(1).split(",")}
        if not heads <= names:
            continue
        targets = set(re.findall(r"[a-z_.]+", re.sub(r"\(.*?\)", "", found.group(2)))) & names
        for head in heads:
            edges[head] = targets
    return edges


def test_the_readme_draws_the_apps_real_imports():
    real: dict[str, set[str]] = {}
    for app in GRAPH_APPS:
        imported: set[str] = set()
        for path in (ROOT / app).rglob("*.py"):  # management commands included
            if "migrations" not in path.parts:
                imported |= {name.split(".")[0] for name in _imports(_module_name(path), path)[0]}
        real[app] = imported & set(GRAPH_APPS) - {app}

    assert _readme_edges(set(GRAPH_APPS)) == real


def test_the_readme_draws_the_engines_real_imports():
    graph = _graph("automations")
    short = {
        m.removeprefix("automations."): {d.removeprefix("automations.") for d in deps}
        for m, deps in graph.items()
    }
    names = set(short) | {"expressions"}
    drawn = {m: targets - {"models"} for m, targets in _readme_edges(names).items()}
    real = {
        m: {d.split(".")[0] if d.startswith("expressions") else d for d in short[m]}
        - {"models", "automations"}
        for m in drawn
    }

    assert len(drawn) >= 15
    assert drawn == real
