"""A definition's size cap (512 KB) holds on every save path, before any template is compiled:
400 ``too_large`` at ``/``, nothing saved."""

from __future__ import annotations

import json
import time

import pytest

from automations import definition as defs
from automations import services
from automations.models import Automation, AutomationVersion
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

# Many small templates: compiling each costs CPU; the cap must refuse before any is compiled.
HUGE = definition(*[transform(f"s{i}", "{{ inputs.x | default('a') }}" * 200) for i in range(20)],
                  blob="x" * (defs.MAX_DEFINITION_BYTES + 1))  # fmt: skip


def _refused_as_too_large(response) -> None:
    assert response.status_code == 400, response.content[:300]
    (error,) = response.json()["errors"]
    assert (error["path"], error["code"]) == ("/", "too_large")


def test_api_create_refuses_an_oversized_definition_before_compiling(api, workspace):
    start = time.thread_time()
    response = api.post("/api/v1/automations", {"definition": HUGE}, format="json")

    _refused_as_too_large(response)
    assert time.thread_time() - start < 1.0
    assert not Automation.objects.exists()


def test_api_update_refuses_an_oversized_definition(api, workspace):
    automation = services.automation_create(workspace=workspace, definition=definition())

    response = api.put(f"/api/v1/automations/{automation.pk}", {"definition": HUGE}, format="json")
    if response.status_code == 405:
        response = api.patch(f"/api/v1/automations/{automation.pk}", {"definition": HUGE}, format="json")

    _refused_as_too_large(response)
    assert AutomationVersion.objects.filter(automation=automation).count() == 1


def test_admin_refuses_an_oversized_definition(workspace, owner):
    from automations.admin import AutomationForm

    form_class = type("Form", (AutomationForm,), {"user": owner})
    form = form_class(data={"workspace": workspace.pk, "definition": json.dumps(HUGE), "status": "active"})

    assert not form.is_valid()
    assert any("too_large" in problem for problem in form.errors["definition"])


def test_a_definition_just_under_the_cap_is_checked_as_usual(workspace):
    body = definition(blob="x")
    padding = defs.MAX_DEFINITION_BYTES - defs.definition_size(body) + 1  # "x" is already there
    body["blob"] = "x" * padding
    assert defs.definition_size(body) == defs.MAX_DEFINITION_BYTES
    issues = defs.validate_definition(body)
    assert all(i["code"] != "too_large" for i in issues)
