"""Small builders shared by the trigger tests."""

from __future__ import annotations

import json

from rest_framework.test import APIClient

from tests.people import client_for  # noqa: F401 - re-exported for the tests here


def definition(
    *, name: str = "triggered", triggers: list | None = None, plan: list | None = None, **extra
) -> dict:
    body = {
        "schema_version": "1.0",
        "name": name,
        "triggers": triggers or [],
        "plan": plan or [{"step_id": "echo", "action": "transform_data", "config": {"output": {"ok": True}}}],
    }
    body.update(extra)
    return body


def webhook(key: str = "hook", **config) -> dict:
    return {"key": key, "type": "webhook", "config": config}


def schedule(key: str = "cron", cron: str = "0 * * * *", **config) -> dict:
    return {"key": key, "type": "schedule", "config": {"cron": cron, **config}}


def event(key: str = "on-event", event_type: str = "files.added", **config) -> dict:
    return {"key": key, "type": "event", "config": {"event_type": event_type, **config}}


def fire(client: APIClient, automation_id, body=b"{}", *, token: str | None = None, content_type="application/json",
         path_suffix: str = "", **headers):  # fmt: skip
    """POST to the fire endpoint with a raw body (bytes, or anything json.dumps takes)."""
    if not isinstance(body, bytes | str):
        body = json.dumps(body)
    if token is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    return client.generic("POST", f"/api/v1/automations/{automation_id}/fire{path_suffix}", body,
                          content_type=content_type, **headers)  # fmt: skip
