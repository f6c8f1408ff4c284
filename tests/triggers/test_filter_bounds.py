"""Expensive event filters are refused at save, each limit with its own code (issue 12, finding 4)."""

from __future__ import annotations

import pytest

from automations.models import Automation
from tests.factories import definition, event

HEAVY_REGEX = "[ab]*a[ab]{990}c"  # passed the old 1,000-instruction check; 0.3-0.5 s per 64 KB event


@pytest.mark.parametrize(
    ("filter", "path", "code"),
    [
        ({"path": "payload.s", "regex": HEAVY_REGEX}, "/regex", "regex_too_complex"),
        (
            {"$or": [{"path": f"payload.s{i}", "regex": "[ab]*a[ab]{50}c"} for i in range(6)]},
            "/$or/5/regex",
            "regex_too_complex",
        ),
        # (10,000, not 100,000: a 100,000-item list is refused first by the 512 KB definition cap.)
        ({"path": "payload.id", "in": list(range(10_000))}, "/in", "list_too_long"),
        ({"path": "payload.id", "not_in": ["x"] * 257}, "/not_in", "list_too_long"),
    ],
    ids=["one-heavy-regex", "regexes-together", "in-10k", "not-in-257"],
)
def test_expensive_filter_is_refused_at_save_with_its_code(api, workspace, filter, path, code):
    # when
    response = api.post(
        "/api/v1/automations",
        {"definition": definition(triggers=[event(filter=filter)])},
        format="json",
    )
    # then
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert [(e["path"], e["code"]) for e in errors] == [(f"/triggers/0/config/filter{path}", code)]
    assert not Automation.objects.exists()
