"""The automations admin: an invalid definition is an inline error on both add and change, never a 500."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from automations import services
from automations.models import Automation
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label="automations",
        codename__in=["view_automation", "add_automation", "change_automation"]))  # fmt: skip
    client = Client()
    client.force_login(user)
    return client


# A step whose action does not exist: the service refuses it with a located error.
BROKEN = definition(transform("a", {"x": 1}), {"step_id": "b", "action": "no_such_action", "config": {}})


def test_an_invalid_definition_on_the_change_page_is_an_inline_error(operator, workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("a", {"x": 1})), user=operator
    )
    admin = staff(operator)
    url = reverse("admin:automations_automation_change", args=[automation.pk])
    assert admin.get(url).status_code == 200

    response = admin.post(url, {"definition": json.dumps(BROKEN), "status": "active"})

    assert response.status_code == 200
    body = response.content.decode()
    assert "errorlist" in body
    assert "no_such_action" in body
    automation.refresh_from_db()
    assert automation.version == 1
    assert automation.definition == definition(transform("a", {"x": 1}))


def test_a_valid_definition_on_the_change_page_saves_a_new_version(operator, workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("a", {"x": 1})), user=operator
    )
    admin = staff(operator)
    changed = definition(transform("a", {"x": 2}))

    response = admin.post(
        reverse("admin:automations_automation_change", args=[automation.pk]),
        {"definition": json.dumps(changed), "status": "active"},
    )

    assert response.status_code == 302
    automation.refresh_from_db()
    assert automation.version == 2
    assert automation.definition == changed


def test_an_invalid_definition_on_the_add_page_is_an_inline_error(operator, workspace):
    response = staff(operator).post(
        reverse("admin:automations_automation_add"),
        {"workspace": workspace.pk, "definition": json.dumps(BROKEN), "status": "active"},
    )

    assert response.status_code == 200
    assert "no_such_action" in response.content.decode()
    assert Automation.objects.count() == 0


def test_staff_see_only_their_own_workspaces_automations(operator, workspace, outsider):
    mine = services.automation_create(
        workspace=workspace,
        definition=definition(transform("a", {"x": 1}), name="quokka-ledger-sync"),
        user=operator,
    )
    admin = staff(outsider)

    listing = admin.get(reverse("admin:automations_automation_changelist"))
    detail = admin.get(reverse("admin:automations_automation_change", args=[mine.pk]))

    assert listing.status_code == 200
    assert "quokka-ledger-sync" not in listing.content.decode()
    assert detail.status_code == 302  # Django's "doesn't exist" redirect to the admin index
    assert (
        staff(operator).get(reverse("admin:automations_automation_change", args=[mine.pk])).status_code == 200
    )


def test_an_archived_automation_on_the_change_page_is_an_inline_error_not_a_500(operator, workspace):
    automation = services.automation_create(
        workspace=workspace, definition=definition(transform("a", {"x": 1})), user=operator
    )
    services.automation_archive(automation=automation, user=operator)
    admin = staff(operator)
    url = reverse("admin:automations_automation_change", args=[automation.pk])
    assert admin.get(url).status_code == 200

    response = admin.post(
        url, {"definition": json.dumps(definition(transform("a", {"x": 2}))), "status": "active"}
    )

    assert response.status_code == 200
    assert "archived" in response.content.decode()
    automation.refresh_from_db()
    assert automation.version == 1
