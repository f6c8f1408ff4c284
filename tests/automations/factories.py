"""Builders for definitions and API clients used across engine tests."""

from __future__ import annotations

from tests.people import client_for  # noqa: F401 - re-exported for the tests here


def definition(*steps, **extra) -> dict:
    body = {"schema_version": "1.0", "name": extra.pop("name", "test automation"), "plan": list(steps)}
    body.update(extra)
    return body


def transform(step_id: str, output, **extra) -> dict:
    return {"step_id": step_id, "action": "transform_data", "config": {"output": output}, **extra}
