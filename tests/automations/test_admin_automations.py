"""The automations list and page as an operator console: last run, runs in 24 h, trigger types and
next fire in a bounded number of queries; the page's pretty definition, triggers with webhook URLs,
recent runs, versions with diffs and a restore through the service, and Run with inputs."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations import services
from automations.models import Automation, Run, RunStatus
from tests.factories import definition, transform

pytestmark = pytest.mark.django_db

TRIGGERS = [
    {"key": "nightly", "type": "schedule", "config": {"cron": "0 9 * * 1-5", "timezone": "Europe/Berlin"}},
    {"key": "hook", "type": "webhook", "config": {}},
]
INPUTS = {"schema": {"type": "object", "required": ["who"], "properties": {
    "who": {"type": "string", "minLength": 2}, "times": {"type": "integer", "default": 1},
    "loud": {"type": "boolean"}}}}  # fmt: skip


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label="automations",
        codename__in=["view_automation", "change_automation", "view_run"]))  # fmt: skip
    client = Client()
    client.force_login(user)
    return client


def _automation(workspace, user, name="greeter", **extra) -> Automation:
    return services.automation_create(
        workspace=workspace, user=user,
        definition=definition(transform("greet", {"hello": "{{ inputs.who }}"}), name=name, inputs=INPUTS, **extra),
    )  # fmt: skip


def _runs(automation, *statuses):
    for status in statuses:
        run = services.run_create(automation=automation, inputs={"who": "Ada"}).run
        Run.objects.filter(pk=run.pk).update(status=status)


def test_the_list_shows_last_run_runs_24h_triggers_and_next_fire(workspace, operator):
    automation = _automation(workspace, operator, triggers=TRIGGERS)
    _runs(automation, RunStatus.SUCCEEDED, RunStatus.FAILED)

    page = staff(operator).get(reverse("admin:automations_automation_changelist")).content.decode()

    assert '<td class="field-last_run"><b style="color:#c62828">failed</b></td>' in page
    assert '<td class="field-runs_24h">2</td>' in page
    assert '<td class="field-trigger_types">schedule, webhook</td>' in page
    assert '<td class="field-next_fire">-</td>' not in page


def test_the_list_costs_the_same_few_queries_for_3_or_30_automations(
    workspace, operator, django_assert_max_num_queries
):
    admin = staff(operator)
    url = reverse("admin:automations_automation_changelist")
    for i in range(3):
        _runs(_automation(workspace, operator, name=f"a{i}", triggers=TRIGGERS), RunStatus.SUCCEEDED)
    admin.get(url)  # warm: session, content types
    with django_assert_max_num_queries(12) as few:
        assert admin.get(url).status_code == 200
    for i in range(3, 30):
        _runs(_automation(workspace, operator, name=f"a{i}", triggers=TRIGGERS), RunStatus.SUCCEEDED)

    with django_assert_max_num_queries(len(few.captured_queries)):
        page = admin.get(url)

    assert page.content.decode().count('class="field-runs_24h">1<') == 30


def test_the_page_shows_pretty_json_webhook_url_recent_runs_and_a_run_button(workspace, operator):
    automation = _automation(workspace, operator, triggers=TRIGGERS)
    _runs(automation, RunStatus.FAILED)

    page = (
        staff(operator)
        .get(reverse("admin:automations_automation_change", args=[automation.pk]))
        .content.decode()
    )

    assert "\n  &quot;name&quot;: &quot;greeter&quot;" in page  # indented, not one line
    assert f"POST /api/v1/automations/{automation.pk}/fire" in page
    assert 'id="recent-runs"' in page
    assert 'id="run-button"' in page


def test_a_viewer_gets_the_read_only_page_and_cannot_save(workspace, operator, viewer):
    """Even with Django's change permission: the role in the workspace decides."""
    automation = _automation(workspace, operator)
    admin = staff(viewer)
    url = reverse("admin:automations_automation_change", args=[automation.pk])

    page = admin.get(url).content.decode()
    assert 'id="run-button"' not in page
    assert 'name="definition"' not in page
    assert 'name="_save"' not in page
    assert '<pre id="definition">' in page
    changed = definition(transform("greet", {"hello": "x"}), name="greeter", inputs=INPUTS)
    response = admin.post(url, {"definition": json.dumps(changed), "status": "active"})

    assert response.status_code == 403
    automation.refresh_from_db()
    assert automation.version == 1


def test_run_with_inputs_goes_through_the_dispatcher(workspace, operator, drive):
    automation = _automation(workspace, operator)
    admin = staff(operator)
    url = reverse("admin:automations_automation_run", args=[automation.pk])
    form = admin.get(url).content.decode()
    assert 'name="in_who"' in form
    assert 'name="in_times"' in form

    bad = admin.post(url, {"in_who": "A", "inputs_json": "{}"})
    assert bad.status_code == 200
    assert "too short" in bad.content.decode()
    assert Run.objects.count() == 0

    response = admin.post(url, {"in_who": "Ada", "in_loud": "true", "inputs_json": '{"extra": [1]}'})

    run = Run.objects.get()
    assert response.status_code == 302
    assert response["Location"] == reverse("admin:automations_run_change", args=[run.pk])
    assert run.inputs == {"who": "Ada", "times": 1, "loud": True, "extra": [1]}
    assert run.triggered_by == "user:operator"
    assert drive(run.pk).status == RunStatus.SUCCEEDED


def test_a_viewer_cannot_run(workspace, operator, viewer):
    automation = _automation(workspace, operator)

    response = staff(viewer).post(reverse("admin:automations_automation_run", args=[automation.pk]),
                                  {"in_who": "Ada", "inputs_json": "{}"}, follow=True)  # fmt: skip

    assert "does not allow" in response.content.decode()
    assert Run.objects.count() == 0


def test_versions_show_a_diff_and_restore_goes_through_the_service(workspace, operator):
    automation = _automation(workspace, operator)
    services.automation_update(
        automation=automation, user=operator,
        definition=definition(transform("greet", {"hello": "changed"}), name="greeter", inputs=INPUTS),
    )  # fmt: skip
    admin = staff(operator)
    page = admin.get(reverse("admin:automations_automation_change", args=[automation.pk])).content.decode()
    assert "diff from version 1" in page
    assert "+          &quot;hello&quot;: &quot;changed&quot;" in page
    restore = reverse("admin:automations_automation_restore", args=[automation.pk, 1])
    assert restore in page
    assert "changed" in admin.get(restore).content.decode()

    response = admin.post(restore, follow=True)

    assert "version 1 restored as version 3" in response.content.decode()
    automation.refresh_from_db()
    assert automation.version == 3
    assert automation.definition["plan"][0]["config"] == {"output": {"hello": "{{ inputs.who }}"}}
    assert (
        AuditEvent.objects.filter(
            type="automation.version_restored", refs__automation=str(automation.pk)
        ).count()
        == 1
    )
    again = admin.post(reverse("admin:automations_automation_restore", args=[automation.pk, 3]), follow=True)
    assert "already the current definition" in again.content.decode()


def test_only_those_who_may_restore_see_the_restore_button(workspace, operator, viewer):
    automation = _automation(workspace, operator)
    services.automation_update(
        automation=automation, user=operator,
        definition=definition(transform("greet", {"hello": "changed"}), name="greeter", inputs=INPUTS),
    )  # fmt: skip
    page = reverse("admin:automations_automation_change", args=[automation.pk])
    restore = reverse("admin:automations_automation_restore", args=[automation.pk, 1])
    operator_client, viewer_client = staff(operator), staff(viewer)

    seen = viewer_client.get(page).content.decode()
    assert "diff from version 1" in seen  # the history stays readable
    assert restore not in seen
    assert "Restore this version" not in seen
    assert restore in operator_client.get(page).content.decode()

    services.automation_archive(automation=automation, user=operator)  # an archived one cannot be restored
    archived = operator_client.get(page).content.decode()
    assert "diff from version 1" in archived
    assert restore not in archived
