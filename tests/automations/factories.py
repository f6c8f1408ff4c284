"""Builders for definitions and API clients used across engine tests."""

from __future__ import annotations

from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient


def definition(*steps, **extra) -> dict:
    body = {"schema_version": "1.0", "name": extra.pop("name", "test automation"), "plan": list(steps)}
    body.update(extra)
    return body


def transform(step_id: str, output, **extra) -> dict:
    return {"step_id": step_id, "action": "transform_data", "config": {"output": output}, **extra}


def client_for(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client
