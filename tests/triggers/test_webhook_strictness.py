"""Webhook parsing is strict (issue 12, finding 6): exact Bearer syntax, no duplicate keys, no encodings."""

from __future__ import annotations

import gzip

from rest_framework.test import APIClient

from automations.models import Run
from tests.factories import fire


def test_bearer_with_two_spaces_is_refused(db, hook):
    automation, _, token = hook()
    response = fire(APIClient(), automation.pk, {"a": 1}, HTTP_AUTHORIZATION=f"Bearer  {token}")
    assert response.status_code == 401
    assert (
        fire(APIClient(), automation.pk, {"a": 1}, HTTP_AUTHORIZATION=f"Bearer {token} ").status_code == 401
    )
    assert (
        fire(APIClient(), automation.pk, {"a": 1}, HTTP_AUTHORIZATION=f"Bearer\t{token}").status_code == 401
    )
    assert Run.objects.count() == 0
    assert fire(APIClient(), automation.pk, {"a": 1}, token=token).status_code == 202


def test_json_with_duplicate_keys_is_400(db, hook):
    automation, _, token = hook()
    response = fire(APIClient(), automation.pk, b'{"amount": 1, "amount": 1000000}', token=token)
    assert response.status_code == 400
    assert "same key twice" in response.json()["error"]["message"]
    assert Run.objects.count() == 0


def test_a_gzip_encoded_body_is_415(db, hook):
    automation, _, token = hook()
    response = fire(APIClient(), automation.pk, gzip.compress(b'{"a": 1}'), token=token,
                    HTTP_CONTENT_ENCODING="gzip")  # fmt: skip
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "UNSUPPORTED_MEDIA_TYPE"
    assert Run.objects.count() == 0
