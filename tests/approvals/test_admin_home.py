"""The admin home page's "Needs you" panel: pending approvals and failed / needs-attention runs of
the last 24 h, scoped to the user's workspaces, each linking to the filtered changelist."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from approvals.models import Approval
from approvals.services import approval_decide
from automations.models import Run, RunStatus
from tests.factories import definition, risk_step


def _home(user) -> str:
    user.is_staff = True
    user.save(update_fields=["is_staff"])
    client = Client()
    client.force_login(user)
    response = client.get(reverse("admin:index"))
    assert response.status_code == 200
    return response.content.decode()


def _row(label: str, count: int, url: str) -> str:
    return f'<tr><th scope="row"><a href="{url}">{label}</a></th><td>{count}</td></tr>'


@pytest.fixture
def busy(drive, target, path_for):
    """One pending approval, two failed runs and one needing attention today, one failed run of last week."""
    run = drive.start(
        drive.automation(definition(risk_step("medium", target.url(path_for("home"))), autonomy="A2"))
    )
    drive.approval(run)

    def copy(status, **extra):
        return Run.objects.create(workspace=run.workspace, automation=run.automation, snapshot=run.snapshot,
                                  automation_version=run.automation_version, status=status, trace_id=run.trace_id,
                                  queue=run.queue, **extra)  # fmt: skip

    copy(RunStatus.FAILED)
    copy(RunStatus.FAILED)
    copy(RunStatus.NEEDS_ATTENTION)
    Run.objects.filter(pk=copy(RunStatus.FAILED).pk).update(created_at=timezone.now() - timedelta(days=7))
    return run


def test_home_shows_what_needs_the_operator_with_links(people, busy):
    body = _home(people.viewer)

    runs = reverse("admin:automations_run_changelist")
    assert 'id="needs-me"' in body
    assert (
        _row(
            "Pending approvals", 1, reverse("admin:approvals_approval_changelist") + "?status__exact=pending"
        )
        in body
    )
    assert _row("Failed runs (24 h)", 2, runs + "?status__exact=failed") in body
    assert _row("Runs needing attention (24 h)", 1, runs + "?status__exact=needs_attention") in body


def test_home_counts_only_the_users_workspaces(people, busy):
    body = _home(people.outsider)

    assert "Pending approvals</a></th><td>0</td>" in body
    assert "Failed runs (24 h)</a></th><td>0</td>" in body
    assert "Runs needing attention (24 h)</a></th><td>0</td>" in body


def test_home_lists_approvals_waiting_for_an_approver_with_what_will_run(people, busy, target):
    approval = Approval.objects.get(run_id=busy.pk)

    body = _home(people.alice)

    assert 'id="approvals-for-me"' in body
    assert reverse("admin:approvals_approval_change", args=[approval.pk]) in body
    assert target.url("") in body  # what will run: the request's URL
    assert "http_request: " in body
    approval_decide(approval_id=approval.pk, user=people.alice, decision="approve", via="admin")
    assert 'id="approvals-for-me"' not in _home(people.alice)  # decided: no longer waiting for her


def test_home_lists_no_approvals_for_a_viewer_but_the_problems_and_platform_state(people, busy):
    Run.objects.filter(status=RunStatus.NEEDS_ATTENTION).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    body = _home(people.viewer)

    assert 'id="approvals-for-me"' not in body
    assert 'id="recent-problems"' in body
    assert body.count('<b style="color:#c62828">failed</b>') == 2  # today's two, not last week's
    assert 'id="failing-automations"' in body  # its last run failed
    assert 'id="platform-state"' in body
    assert "automations_fast" in body


def test_home_cues_when_more_than_five_medium_or_higher_approvals_wait(drive, people, target, path_for):
    medium = drive.automation(definition(risk_step("medium", target.url(path_for("backlog"))), autonomy="A2"))
    asks = drive.automation(definition({"step_id": "gate", "action": "require_approval",
                                        "config": {"message": "low-risk checkpoint"}}, name="low"))  # fmt: skip
    for _ in range(5):
        drive.start(medium)
    drive.start(asks)  # low risk: not part of the cue

    assert 'id="risky-backlog"' not in _home(people.alice)  # five wait: no cue yet

    drive.start(medium)
    body = _home(people.alice)

    assert 'id="risky-backlog"' in body
    assert "6 medium-or-higher-risk approvals are waiting" in body
    assert 'id="risky-backlog"' not in _home(people.outsider)  # none of them are the outsider's
