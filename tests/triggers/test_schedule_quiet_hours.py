"""A schedule trigger with ``"quiet_hours": "skip"`` records ``schedule.skipped`` instead of firing
while its workspace's quiet hours hold (issue 29). Fires are driven as beat drives them, with ``now``
passed in: across midnight, and on a daylight-saving change day."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEvent
from automations.models import Run
from tests.factories import definition, schedule
from triggers.models import Trigger
from triggers.tasks import fire_schedule
from workspaces.services import workspace_update

pytestmark = pytest.mark.django_db

NIGHT = {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}


@pytest.fixture
def quiet_workspace(workspace, owner):
    workspace_update(workspace=workspace, user=owner, quiet_hours=NIGHT)
    return workspace


def _trigger(make_automation, accounted_until: datetime, **config) -> Trigger:
    automation = make_automation(definition(triggers=[schedule(cron="0 * * * *", **config)]))
    trigger = Trigger.objects.get(automation=automation)
    Trigger.objects.filter(pk=trigger.pk).update(last_scheduled_for=accounted_until)
    return trigger


def _skipped(trigger) -> list[str]:
    rows = AuditEvent.objects.filter(type="schedule.skipped", refs__trigger=str(trigger.pk)).order_by("id")
    return [row.payload["scheduled_for"] for row in rows]


def _fire(trigger, at: datetime) -> str:
    return fire_schedule(str(trigger.pk), now=at.isoformat())


def test_a_slot_inside_quiet_hours_across_midnight_is_skipped_and_audited(quiet_workspace, make_automation):
    midnight = datetime(2030, 1, 7, 23, 0, tzinfo=UTC)  # 00:00 in Berlin (CET)
    trigger = _trigger(make_automation, midnight - timedelta(hours=1), quiet_hours="skip")

    assert _fire(trigger, midnight + timedelta(seconds=2)) == "skipped"
    assert _fire(trigger, midnight + timedelta(hours=6, seconds=2)) == "skipped"  # 06:00 Berlin
    assert (
        _fire(trigger, midnight + timedelta(hours=7, seconds=2)) == "fired"
    )  # 07:00 Berlin: the end is not inside

    assert _skipped(trigger) == [midnight.isoformat(), (midnight + timedelta(hours=6)).isoformat()]
    (run,) = Run.objects.filter(trigger_id=trigger.pk)
    assert run.trigger_payload["scheduled_for"] == (midnight + timedelta(hours=7)).isoformat()
    stored = Trigger.objects.get(pk=trigger.pk)
    assert stored.last_scheduled_for == midnight + timedelta(hours=7)  # skipped slots are accounted for
    assert _fire(trigger, midnight + timedelta(hours=7, seconds=30)) == "already_fired"


def test_on_the_spring_dst_day_the_window_ends_at_seven_local_time(quiet_workspace, make_automation):
    # 2030-03-31: Berlin goes from CET (UTC+1) to CEST (UTC+2) at 02:00 local, so 05:00 UTC is
    # 06:00 (inside) the day before and 07:00 (outside) that day.
    day_before, dst_day = datetime(2030, 3, 30, 5, 0, tzinfo=UTC), datetime(2030, 3, 31, 5, 0, tzinfo=UTC)
    before = _trigger(make_automation, day_before - timedelta(hours=1), quiet_hours="skip")
    on_the_day = Trigger.objects.get(pk=before.pk)
    Trigger.objects.filter(pk=before.pk).update(last_scheduled_for=dst_day - timedelta(hours=2))

    assert _fire(on_the_day, dst_day - timedelta(hours=1) + timedelta(seconds=1)) == "skipped"  # 06:00 CEST
    assert _fire(on_the_day, dst_day + timedelta(seconds=1)) == "fired"  # 07:00 CEST
    Trigger.objects.filter(pk=before.pk).update(last_scheduled_for=day_before - timedelta(hours=1))
    assert _fire(before, day_before + timedelta(seconds=1)) == "skipped"  # 06:00 CET

    assert _skipped(before) == [(dst_day - timedelta(hours=1)).isoformat(), day_before.isoformat()]


def test_a_trigger_without_skip_fires_inside_quiet_hours(quiet_workspace, make_automation):
    midnight = datetime(2030, 1, 7, 23, 0, tzinfo=UTC)
    trigger = _trigger(make_automation, midnight - timedelta(hours=1))

    assert _fire(trigger, midnight + timedelta(seconds=1)) == "fired"
    assert _skipped(trigger) == []


def test_skip_without_quiet_hours_in_the_workspace_fires(workspace, make_automation):
    midnight = datetime(2030, 1, 7, 23, 0, tzinfo=UTC)
    trigger = _trigger(make_automation, midnight - timedelta(hours=1), quiet_hours="skip")

    assert _fire(trigger, midnight + timedelta(seconds=1)) == "fired"


def test_a_catch_up_run_inside_quiet_hours_is_skipped_too(quiet_workspace, make_automation):
    midnight = datetime(2030, 1, 7, 23, 0, tzinfo=UTC)
    trigger = _trigger(
        make_automation, midnight - timedelta(hours=3), quiet_hours="skip", catch_up="run_once"
    )

    _fire(trigger, midnight + timedelta(seconds=1))

    assert not Run.objects.filter(trigger_id=trigger.pk).exists()
    assert midnight.isoformat() in _skipped(trigger)
