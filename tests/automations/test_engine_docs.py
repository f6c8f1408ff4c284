"""The examples in the docs are real: every complete definition there validates."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from automations.definition import validate_definition

ROOT = Path(__file__).resolve().parent.parent.parent
BLOCK = re.compile(r"```json\n(.*?)```", re.DOTALL)


def doc_definitions():
    for doc in sorted((ROOT / "docs").glob("*.md")):
        for block in BLOCK.findall(doc.read_text()):
            value = json.loads(block)
            if isinstance(value, dict) and "schema_version" in value:
                yield pytest.param(value, id=f"{doc.name}:{value['name']}")


@pytest.mark.parametrize("definition", list(doc_definitions()))
def test_definition_in_docs_is_valid(definition):
    assert validate_definition(definition, workspace_id=None, credential_names=None) == []


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.json")), ids=lambda p: p.name)
def test_shipped_examples_are_valid(path):
    assert validate_definition(json.loads(path.read_text()), workspace_id=None, credential_names=None) == []


@pytest.mark.parametrize("doc", ["definition-format.md", "triggers.md"])
def test_trigger_examples_in_docs_are_valid(doc):
    text = (ROOT / "docs" / doc).read_text()
    triggers = [t for t in map(json.loads, BLOCK.findall(text)) if "key" in t and "type" in t]
    assert len(triggers) == 3
    wrapper = {"schema_version": "1.0", "name": "t", "triggers": triggers,
               "plan": [{"step_id": "a", "action": "transform_data", "config": {"output": 1}}]}  # fmt: skip
    assert validate_definition(wrapper) == []
