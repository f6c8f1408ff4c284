"""Four-eyes stays off by default (a one-person trial approves its own runs), but ``check --deploy``
and ``doctor`` warn about each workspace with it off where two or more people may approve."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from ops.doctor import WARN, check_four_eyes
from tests.factories import member
from workspaces.models import Role, Workspace
from workspaces.services import workspace_get_or_create

pytestmark = pytest.mark.django_db


def deploy_check_output() -> str:
    out, err = StringIO(), StringIO()
    call_command("check", deploy=True, stdout=out, stderr=err)
    return out.getvalue() + err.getvalue()


def test_a_single_admin_workspace_is_not_flagged(workspace, owner, operator):
    assert not workspace.four_eyes  # the default
    assert "workspaces.W001" not in deploy_check_output()
    assert [f.status for f in check_four_eyes()] == ["ok"]


@pytest.mark.parametrize("second", [Role.ADMIN, Role.APPROVER])
def test_two_people_who_may_approve_without_four_eyes_are_flagged(workspace, owner, second):
    member("second", workspace, second)

    output = deploy_check_output()
    (finding,) = check_four_eyes()

    assert "workspaces.W001" in output
    assert workspace.slug in output
    assert (finding.status, finding.check) == (WARN, "four_eyes")
    assert workspace.slug in finding.message


def test_turning_four_eyes_on_clears_the_warning(workspace, owner):
    member("second", workspace, Role.APPROVER)
    Workspace.objects.filter(pk=workspace.pk).update(four_eyes=True)
    other = workspace_get_or_create(slug="solo")
    member("solo-admin", other, Role.ADMIN)

    assert "workspaces.W001" not in deploy_check_output()
    assert [f.status for f in check_four_eyes()] == ["ok"]
