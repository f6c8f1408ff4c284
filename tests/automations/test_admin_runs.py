"""The run page as an operator console: Cancel, Re-run from a step and Resolve buttons through the
services (role-checked, audited, a refusal is a message and never a 500), step configs and outputs,
and links to the run's approvals and audit trace."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission as AuthPermission
from django.test import Client
from django.urls import reverse

from audit.models import AuditEvent
from automations import events, services
from automations.models import DomainEvent, Run, RunStatus
from tests.factories import definition, event, transform

pytestmark = pytest.mark.django_db


def staff(user) -> Client:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    user.user_permissions.add(*AuthPermission.objects.filter(
        content_type__app_label="automations", codename__in=["view_run", "view_automation"]))  # fmt: skip
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def automation(workspace, operator):
    return services.automation_create(
        workspace=workspace, user=operator,
        definition=definition(transform("a", {"x": 1}, output_as="first"), transform("b", {"y": "{{ first.x }}"}),
                              name="two-steps"),
    )  # fmt: skip


def _page(run: Run) -> str:
    return reverse("admin:automations_run_change", args=[run.pk])


def _audit(kind: str, run: Run) -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(type=kind, refs__run=str(run.pk)))


def test_an_operator_sees_cancel_on_an_active_run_and_cancels_it(automation, operator):
    run = services.run_create(automation=automation, inputs={}, user=operator).run
    admin = staff(operator)

    page = admin.get(_page(run)).content.decode()
    assert 'id="cancel-button"' in page
    assert 'id="resolve-button"' not in page
    confirm = admin.get(reverse("admin:automations_run_cancel", args=[run.pk]))
    assert confirm.status_code == 200
    assert "Yes, cancel the run" in confirm.content.decode()

    response = admin.post(reverse("admin:automations_run_cancel", args=[run.pk]), follow=True)

    assert response.status_code == 200
    assert "cancel requested" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert len(_audit("operator.run.cancelled", run)) == 1


def test_a_viewer_gets_no_buttons_and_a_refusal_not_a_500(automation, operator, viewer):
    run = services.run_create(automation=automation, inputs={}, user=operator).run
    admin = staff(viewer)

    page = admin.get(_page(run)).content.decode()
    assert 'id="cancel-button"' not in page
    response = admin.post(reverse("admin:automations_run_cancel", args=[run.pk]), follow=True)

    assert response.status_code == 200
    assert "does not allow" in response.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED
    assert _audit("operator.run.cancelled", run) == []


def test_an_outsider_cannot_reach_the_action_at_all(automation, operator, outsider):
    run = services.run_create(automation=automation, inputs={}, user=operator).run

    response = staff(outsider).post(reverse("admin:automations_run_cancel", args=[run.pk]))

    assert response.status_code == 404
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED


def test_cancelling_a_finished_run_is_a_message(automation, operator, drive):
    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)
    assert run.status == RunStatus.SUCCEEDED

    response = staff(operator).post(reverse("admin:automations_run_cancel", args=[run.pk]), follow=True)

    assert response.status_code == 200
    assert "a succeeded run cannot be cancelled" in response.content.decode()


def test_rerun_from_a_chosen_step_reuses_the_earlier_output(automation, operator, drive):
    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)
    admin = staff(operator)
    form = admin.get(reverse("admin:automations_run_rerun", args=[run.pk])).content.decode()
    assert '<option value="b">b</option>' in form

    response = admin.post(reverse("admin:automations_run_rerun", args=[run.pk]), {"from_step": "b"})

    new = Run.objects.exclude(pk=run.pk).get()
    assert response.status_code == 302
    assert response["Location"] == _page(new)
    assert new.parent_run_id == run.pk
    # It walks past the reused step "a" first (asking again, were it gated now) and runs from "b".
    assert new.step_index == 0
    assert new.steps.get(step_id="a").status == "succeeded"
    assert drive(new.pk).status == RunStatus.SUCCEEDED
    assert len(_audit("operator.run.rerun", new)) == 2  # on both traces


def test_resolve_needs_a_reason_and_is_audited_with_it(automation, operator):
    run = services.run_create(automation=automation, inputs={}, user=operator).run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.NEEDS_ATTENTION)
    admin = staff(operator)
    url = reverse("admin:automations_run_resolve", args=[run.pk])
    assert 'id="resolve-button"' in admin.get(_page(run)).content.decode()

    missing = admin.post(url, {"resolution": "failed", "reason": ""})
    assert missing.status_code == 200
    assert "errorlist" in missing.content.decode()
    response = admin.post(url, {"resolution": "failed", "reason": "the vendor says it never arrived"})

    assert response.status_code == 302
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    [row] = _audit("operator.run.resolved", run)
    assert row.payload["reason"] == "the vendor says it never arrived"


def test_resolving_a_run_that_does_not_need_attention_is_a_message(automation, operator):
    run = services.run_create(automation=automation, inputs={}, user=operator).run

    response = staff(operator).post(reverse("admin:automations_run_resolve", args=[run.pk]),
                                    {"resolution": "retry", "reason": "why not"}, follow=True)  # fmt: skip

    assert "only needs_attention runs can be resolved" in response.content.decode()


def test_the_run_page_shows_step_configs_outputs_and_links(automation, operator, drive):
    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)

    page = staff(operator).get(_page(run)).content.decode()

    assert 'id="step-timeline"' in page
    assert "&quot;y&quot;: 1" in page  # step b's rendered config
    assert reverse("admin:approvals_approval_changelist") + f"?run_id={run.pk}&amp;status__exact=all" in page
    assert reverse("admin:audit_auditevent_changelist") + f"?trace_id={run.trace_id}" in page


def test_the_runs_list_has_a_short_id_error_and_duration(automation, operator, drive):
    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)
    failed = services.run_create(automation=automation, inputs={}, user=operator).run
    Run.objects.filter(pk=failed.pk).update(
        status=RunStatus.FAILED, error={"code": "HTTP_ERROR", "message": "upstream said 503"}
    )

    page = staff(operator).get(reverse("admin:automations_run_changelist")).content.decode()

    assert f">{str(run.pk)[:8]}</a>" in page
    assert f">{run.pk}<" not in page  # the full UUID is never a cell's text (it wrapped over 4 lines)
    assert "HTTP_ERROR: upstream said 503" in page
    assert " s</td>" in page  # a duration


def test_the_run_page_links_along_an_event_chain_with_its_depth(workspace, operator, drive):
    upstream = services.automation_create(
        workspace=workspace, user=operator, definition=definition(name="upstream")
    )
    services.automation_create(workspace=workspace, user=operator, definition=definition(name="downstream", triggers=[
        event(event_type="automation.run.succeeded", filter={"path": "payload.automation_id", "equals": str(upstream.pk)})]))  # fmt: skip
    first = drive(services.run_create(automation=upstream, inputs={}, user=operator).run.pk)
    for pk in DomainEvent.objects.values_list("pk", flat=True):
        events.deliver(str(pk))
    (second,) = Run.objects.filter(parent_run=first)
    drive(second.pk)
    rerun = services.run_rerun(run=first, user=operator)
    admin = staff(operator)

    top = admin.get(_page(first)).content.decode()
    below = admin.get(_page(second)).content.decode()

    assert 'id="chain-depth">depth 0<' in top
    assert f'href="{_page(second)}" class="child-link">{str(second.pk)[:8]}</a> downstream' in top
    assert f'href="{_page(rerun)}" class="child-link">{str(rerun.pk)[:8]}</a> upstream' in top
    assert "(by event)" in top
    assert "(re-run)" in top
    assert 'id="chain-depth">depth 1<' in below
    assert (
        f'started by an event of <a href="{_page(first)}" id="parent-link">{str(first.pk)[:8]}</a>' in below
    )
    assert 'id="child-runs">started no run<' in below
    assert "re-run of" in admin.get(_page(rerun)).content.decode()

    # A re-run is not an event hop: it keeps the depth of the run it repeats, and so do its events.
    again = services.run_rerun(run=second, user=operator)
    assert again.chain_depth == second.chain_depth == 1
    page = admin.get(_page(again)).content.decode()
    assert 'id="chain-depth">depth 1<' in page
    assert f're-run of <a href="{_page(second)}" id="parent-link">' in page
    drive(again.pk)
    assert DomainEvent.objects.filter(parent_run_id=again.pk).get().chain_depth == 2


def test_the_confirm_pages_share_one_form(automation, operator, drive):
    run = drive(services.run_create(automation=automation, inputs={}, user=operator).run.pk)
    services.automation_update(
        automation=automation, user=operator, definition={**automation.definition, "name": "v2"}
    )
    admin = staff(operator)
    pages = {
        "run": reverse("admin:automations_automation_run", args=[automation.pk]),
        "restore": reverse("admin:automations_automation_restore", args=[automation.pk, 1]),
        "rerun": reverse("admin:automations_run_rerun", args=[run.pk]),
        "cancel": reverse("admin:automations_run_cancel", args=[run.pk]),
    }

    for name, url in pages.items():
        response = admin.get(url)
        assert response.status_code == 200, name
        assert "admin/automations/_confirm_form.html" in [t.name for t in response.templates], name
        assert 'name="csrfmiddlewaretoken"' in response.content.decode(), name
    assert 'value="Restore version 1"' in admin.get(pages["restore"]).content.decode()
