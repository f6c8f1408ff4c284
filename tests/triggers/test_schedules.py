"""Schedule triggers (SPEC §6.1): slots, beat entries, catch-up, and one run per slot.

Fires are driven exactly as beat drives them (the ``autoplane.fire_schedule`` task
with the trigger id), with ``now`` passed in instead of sleeping.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audit.models import AuditEvent
from automations import services
from automations.models import Automation, DispatchKey, Run, RunStatus
from tests.factories import definition, schedule
from triggers import schedules
from triggers.models import Trigger
from triggers.tasks import fire_schedule

T0 = datetime(2030, 1, 7, 10, 0, tzinfo=UTC)  # a Monday


def _at(moment: datetime) -> str:
    return moment.isoformat()


def _trigger(make_automation, *, cron="0 * * * *", accounted_until=None, execution=None, inputs_schema=None,
             **config) -> Trigger:  # fmt: skip
    extra = {}
    if execution:
        extra["execution"] = execution
    if inputs_schema:
        extra["inputs"] = {"schema": inputs_schema}
    automation = make_automation(definition(triggers=[schedule(cron=cron, **config)], **extra))
    trigger = Trigger.objects.get(automation=automation)
    Trigger.objects.filter(pk=trigger.pk).update(last_scheduled_for=accounted_until)
    trigger.refresh_from_db()
    return trigger


def _runs(trigger) -> list[Run]:
    return list(Run.objects.filter(trigger_id=trigger.pk).order_by("created_at"))


def _slots(trigger) -> list[str]:
    return sorted(run.trigger_payload["scheduled_for"] for run in _runs(trigger))


# --- slots -----------------------------------------------------------------------------------


def test_the_slot_of_a_fire_is_the_latest_cron_slot_at_or_before_now():
    utc = ZoneInfo("UTC")
    assert schedules.slot_at_or_before("0 * * * *", utc, T0) == T0
    assert schedules.slot_at_or_before("0 * * * *", utc, T0 + timedelta(minutes=59, seconds=59)) == T0
    assert schedules.slot_at_or_before("0 * * * *", utc, T0 - timedelta(microseconds=1)) == T0 - timedelta(
        hours=1
    )
    assert schedules.slot_after("0 * * * *", utc, T0) == T0 + timedelta(hours=1)


def test_slots_are_computed_in_the_trigger_time_zone():
    berlin = ZoneInfo("Europe/Berlin")
    winter = schedules.slot_at_or_before("0 9 * * *", berlin, datetime(2030, 1, 7, 12, 0, tzinfo=UTC))
    summer = schedules.slot_at_or_before("0 9 * * *", berlin, datetime(2030, 7, 8, 12, 0, tzinfo=UTC))

    assert winter == datetime(2030, 1, 7, 8, 0, tzinfo=UTC)  # 09:00 CET
    assert summer == datetime(2030, 7, 8, 7, 0, tzinfo=UTC)  # 09:00 CEST
    assert winter.tzinfo == UTC


def test_missed_slots_between_two_moments_are_listed_oldest_first_and_capped():
    utc = ZoneInfo("UTC")
    slots, more = schedules.slots_between("0 * * * *", utc, T0 - timedelta(hours=4), T0)
    assert slots == [T0 - timedelta(hours=h) for h in (3, 2, 1)]
    assert more is False

    slots, more = schedules.slots_between("* * * * *", utc, T0 - timedelta(days=30), T0, limit=10)
    assert slots == [T0 - timedelta(minutes=m) for m in range(10, 0, -1)]
    assert more is True


def test_the_beat_crontab_mirrors_the_cron_expression():
    assert schedules.crontab_fields("0 9 * * 1-5") == {
        "minute": "0", "hour": "9", "day_of_month": "*", "month_of_year": "*", "day_of_week": "1,2,3,4,5",
    }  # fmt: skip
    assert schedules.crontab_fields("*/15 8-9 * jan,jul sun")["day_of_week"] == "0"
    assert schedules.crontab_fields("*/15 8-9 * jan,jul sun")["month_of_year"] == "1,7"
    # cron ORs day-of-month and day-of-week, Celery ANDs them: beat ticks daily, croniter decides
    fields = schedules.crontab_fields("0 9 1 * 1")
    assert (fields["day_of_month"], fields["day_of_week"]) == ("*", "*")


# --- beat entries follow the definition ------------------------------------------------------------


def test_a_schedule_trigger_gets_a_periodic_task_in_its_time_zone(db, make_automation):
    automation = make_automation(
        definition(triggers=[schedule(cron="30 9 * * 1-5", timezone="Europe/Berlin")])
    )
    trigger = Trigger.objects.get(automation=automation)

    task = trigger.periodic_task
    assert task.task == "autoplane.fire_schedule"
    assert task.kwargs == f'{{"trigger_id": "{trigger.pk}"}}'
    assert task.queue == "default"
    assert task.enabled is True
    assert (task.crontab.minute, task.crontab.hour, task.crontab.day_of_week) == ("30", "9", "1,2,3,4,5")
    assert str(task.crontab.timezone) == "Europe/Berlin"
    assert trigger.last_scheduled_for is not None  # slots before the trigger existed are not "missed"


def test_pausing_disables_the_beat_entry_and_resuming_restarts_the_slot_count(db, make_automation, owner):
    automation = make_automation(definition(triggers=[schedule()]))
    trigger = Trigger.objects.get(automation=automation)
    long_ago = datetime.now(UTC) - timedelta(days=400)
    Trigger.objects.filter(pk=trigger.pk).update(last_scheduled_for=long_ago)

    services.automation_update(automation=automation, status="paused", user=owner)
    paused = Trigger.objects.get(pk=trigger.pk)
    assert paused.enabled is False
    assert PeriodicTask.objects.get(pk=trigger.periodic_task_id).enabled is False

    services.automation_update(automation=automation, status="active", user=owner)
    resumed = Trigger.objects.get(pk=trigger.pk)
    assert resumed.enabled is True
    assert PeriodicTask.objects.get(pk=trigger.periodic_task_id).enabled is True
    assert resumed.last_scheduled_for > long_ago + timedelta(days=399)  # the paused months were not "missed"


def test_editing_the_cron_updates_the_same_trigger_and_its_crontab(db, make_automation, owner):
    automation = make_automation(definition(triggers=[schedule(cron="0 * * * *")]))
    trigger = Trigger.objects.get(automation=automation)

    services.automation_update(automation=automation, user=owner,
                               definition=definition(triggers=[schedule(cron="15 3 * * *", timezone="Asia/Tokyo")]))  # fmt: skip

    again = Trigger.objects.get(automation=automation)
    assert again.pk == trigger.pk
    assert again.periodic_task_id == trigger.periodic_task_id
    assert (again.periodic_task.crontab.minute, again.periodic_task.crontab.hour) == ("15", "3")
    assert str(again.periodic_task.crontab.timezone) == "Asia/Tokyo"
    assert schedules.next_fire_at(again, T0) == datetime(2030, 1, 7, 18, 15, tzinfo=UTC)  # 03:15 JST next day


def test_removing_the_trigger_or_purging_the_automation_removes_the_beat_entry(db, make_automation, owner):
    first = make_automation(definition(name="first", triggers=[schedule()]))
    second = make_automation(definition(name="second", triggers=[schedule(cron="5 * * * *")]))
    first_task = Trigger.objects.get(automation=first).periodic_task_id
    second_task = Trigger.objects.get(automation=second).periodic_task_id

    services.automation_update(automation=first, user=owner, definition=definition(name="first"))
    services.automation_archive(automation=second, user=owner)
    assert PeriodicTask.objects.get(pk=second_task).enabled is False, "archived: the beat entry is off"
    services.automation_purge(automation=second, user=owner)

    assert not Trigger.objects.exists()
    assert not PeriodicTask.objects.filter(pk__in=[first_task, second_task]).exists()
    assert not CrontabSchedule.objects.filter(
        periodictask__isnull=True, minute__in=["0", "5"], hour="*"
    ).exists()


# --- firing ------------------------------------------------------------------------------------------------


def test_a_fire_runs_the_current_slot_once(db, make_automation, drive):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=1), inputs={"region": "eu"})

    assert fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=2))) == "fired"
    assert fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=30))) == "already_fired"

    (run,) = _runs(trigger)
    assert (run.trigger_type, run.trigger_key) == ("schedule", "cron")
    assert run.inputs == {"region": "eu"}
    assert run.trigger_payload["scheduled_for"] == T0.isoformat()
    assert drive(run.pk).status == RunStatus.SUCCEEDED
    stored = Trigger.objects.get(pk=trigger.pk)
    assert stored.last_scheduled_for == T0
    assert stored.last_fired_at == T0
    assert DispatchKey.objects.filter(scope=f"trigger:{trigger.pk}", key=f"slot:{T0.isoformat()}").exists()


def test_the_dispatch_key_alone_refuses_a_second_run_for_a_slot(db, make_automation):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=1))
    fire_schedule(str(trigger.pk), now=_at(T0))
    # as if a second beat's bookkeeping had been lost: only the slot's dedupe key stands in the way
    Trigger.objects.filter(pk=trigger.pk).update(last_scheduled_for=T0 - timedelta(hours=1))

    fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=1)))

    assert len(_runs(trigger)) == 1


def test_last_fired_at_resolves_to_the_previous_slot(db, make_automation):
    trigger = _trigger(
        make_automation, accounted_until=T0 - timedelta(hours=1),
        inputs_schema={"type": "object", "properties": {"since": {"type": "string", "default": "$last_fired_at"}}},
    )  # fmt: skip

    fire_schedule(str(trigger.pk), now=_at(T0))
    fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(hours=1)))

    first, second = _runs(trigger)
    assert first.inputs["since"] == trigger.created_at.isoformat()  # the first fire: since the trigger exists
    assert second.inputs["since"] == T0.isoformat()
    assert Trigger.objects.get(pk=trigger.pk).last_fired_at == T0 + timedelta(hours=1)


def test_a_paused_automation_or_disabled_trigger_does_not_run(db, make_automation, owner):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=1))
    services.automation_update(automation=trigger.automation, status="paused", user=owner)
    disabled = make_automation(definition(name="off", triggers=[{**schedule(), "enabled": False}]))

    assert fire_schedule(str(trigger.pk), now=_at(T0)) == "disabled"
    assert fire_schedule(str(Trigger.objects.get(automation=disabled).pk), now=_at(T0)) == "disabled"
    assert fire_schedule("00000000-0000-0000-0000-000000000000", now=_at(T0)) == "not_found"
    assert not Run.objects.exists()


def test_a_slot_whose_dispatch_fails_is_audited_and_not_retried_forever(db, make_automation):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=1),
                       inputs_schema={"type": "object", "required": ["must"]})  # fmt: skip

    assert fire_schedule(str(trigger.pk), now=_at(T0)) == "fired"

    assert not Run.objects.exists()
    assert (
        AuditEvent.objects.filter(type="trigger.dispatch_failed", refs__trigger=str(trigger.pk)).count() == 1
    )
    assert Trigger.objects.get(pk=trigger.pk).last_scheduled_for == T0


# --- catch-up ------------------------------------------------------------------------------------------------


def _missed_audits(trigger) -> list[AuditEvent]:
    return list(
        AuditEvent.objects.filter(type="schedule.missed", refs__trigger=str(trigger.pk)).order_by("id")
    )


def test_catch_up_skip_audits_each_missed_slot_and_runs_only_the_current_one(db, make_automation):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=5), catch_up="skip")

    assert fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=1))) == "caught_up"

    assert _slots(trigger) == [T0.isoformat()]
    assert [e.payload["scheduled_for"] for e in _missed_audits(trigger)] == [
        (T0 - timedelta(hours=h)).isoformat() for h in (4, 3, 2, 1)
    ]


def test_catch_up_run_once_starts_one_run_for_all_missed_slots(db, make_automation):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=5), catch_up="run_once")

    fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=1)))

    catch_up, current = _runs(trigger)
    assert catch_up.trigger_payload["catch_up"] == "run_once"
    assert catch_up.trigger_payload["missed_count"] == 4
    assert catch_up.trigger_payload["scheduled_for"] == (T0 - timedelta(hours=1)).isoformat()
    assert current.trigger_payload["scheduled_for"] == T0.isoformat()
    assert AuditEvent.objects.filter(type="schedule.caught_up", refs__trigger=str(trigger.pk)).count() == 1
    assert not _missed_audits(trigger)


def test_catch_up_run_all_capped_runs_the_latest_ten_and_audits_the_rest(db, make_automation):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=16), catch_up="run_all_capped")

    fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=1)))

    assert _slots(trigger) == sorted((T0 - timedelta(hours=h)).isoformat() for h in range(0, 11))
    assert [e.payload.get("scheduled_for") for e in _missed_audits(trigger)] == [
        (T0 - timedelta(hours=h)).isoformat() for h in range(15, 10, -1)
    ]


def test_a_fire_long_after_its_slot_counts_the_slot_as_missed(db, make_automation):
    """Beat, restarted after an outage, ticks once at once: that tick's slot was missed too."""
    skip = _trigger(
        make_automation, cron="0 9 * * *", accounted_until=T0 - timedelta(days=3), catch_up="skip"
    )
    once = _trigger(
        make_automation, cron="0 9 * * *", accounted_until=T0 - timedelta(days=3), catch_up="run_once"
    )
    restart = T0 + timedelta(hours=2)  # 12:00, the 09:00 slot is three hours old

    fire_schedule(str(skip.pk), now=_at(restart))
    fire_schedule(str(once.pk), now=_at(restart))

    assert not _runs(skip)
    assert len(_missed_audits(skip)) == 3  # the two days before, and this morning
    (run,) = _runs(once)
    assert run.trigger_payload["missed_count"] == 3
    assert run.trigger_payload["scheduled_for"] == datetime(2030, 1, 7, 9, 0, tzinfo=UTC).isoformat()
    assert Trigger.objects.get(pk=once.pk).last_scheduled_for == datetime(2030, 1, 7, 9, 0, tzinfo=UTC)


def test_a_long_outage_is_summarised_instead_of_audited_slot_by_slot(db, make_automation):
    trigger = _trigger(
        make_automation, cron="* * * * *", accounted_until=T0 - timedelta(days=30), catch_up="skip"
    )

    fire_schedule(str(trigger.pk), now=_at(T0))

    audits = _missed_audits(trigger)
    assert len(audits) == schedules.MAX_MISSED_AUDITED + 1
    assert audits[-1].payload["more"] is True
    assert _slots(trigger) == [T0.isoformat()]


# --- concurrency -----------------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_fires_of_one_slot_start_one_run(make_automation, no_enqueue):
    trigger = _trigger(make_automation, accounted_until=T0 - timedelta(hours=3), catch_up="run_all_capped")
    barrier = threading.Barrier(5)
    outcomes = []

    def beat():
        try:
            barrier.wait(10)
            outcomes.append(fire_schedule(str(trigger.pk), now=_at(T0 + timedelta(seconds=1))))
        finally:
            connection.close()

    threads = [threading.Thread(target=beat) for _ in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert sorted(outcomes) == ["already_fired"] * 4 + ["caught_up"]
    assert _slots(trigger) == sorted((T0 - timedelta(hours=h)).isoformat() for h in range(3))


# --- a real worker ---------------------------------------------------------------------------------------------


@pytest.mark.workers
def test_a_beat_tick_consumed_by_a_real_worker_starts_and_finishes_one_run(celery_workers, make_automation):
    from config.celery import app

    trigger = _trigger(make_automation, cron="* * * * *")
    now = datetime.now(UTC)

    for _ in range(3):  # a duplicated tick (two beats, a redelivery) changes nothing
        app.send_task(
            "autoplane.fire_schedule", kwargs={"trigger_id": str(trigger.pk), "now": now.isoformat()}
        )

    assert _wait_for(lambda: [r.status for r in _runs(trigger)] == [RunStatus.SUCCEEDED], 60)
    time.sleep(0.5)  # the duplicates have been consumed by now, too
    (run,) = _runs(trigger)
    slot = schedules.slot_at_or_before("* * * * *", ZoneInfo("UTC"), now)
    assert run.trigger_payload["scheduled_for"] == slot.isoformat()


@pytest.mark.workers
def test_a_real_beat_fires_the_schedule_through_its_periodic_task(
    celery_workers, beat_process, make_automation
):
    """Beat (DatabaseScheduler) reads the trigger's PeriodicTask and ticks at the next minute."""
    trigger = _trigger(make_automation, cron="* * * * *", timezone="Europe/Berlin")
    Trigger.objects.filter(pk=trigger.pk).update(
        last_scheduled_for=schedules.schedule_baseline(trigger.config)
    )

    beat_process(max_interval=1)

    assert _wait_for(lambda: any(r.status == RunStatus.SUCCEEDED for r in _runs(trigger)), 90)
    first = _runs(trigger)[0]
    slot = datetime.fromisoformat(first.trigger_payload["scheduled_for"])
    assert (slot.second, slot.microsecond) == (0, 0)
    assert first.created_at - slot < timedelta(seconds=30)
    assert len({r.trigger_payload["scheduled_for"] for r in _runs(trigger)}) == len(_runs(trigger))


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


def test_admin_bulk_delete_archives_through_the_service_audits_and_disables_beat_entries(
    db, make_automation, owner
):
    first = make_automation(definition(name="first", triggers=[schedule()]))
    second = make_automation(definition(name="second", triggers=[schedule()]))
    tasks = [Trigger.objects.get(automation=a).periodic_task_id for a in (first, second)]
    admin = get_user_model().objects.create_superuser("bulk-admin", "bulk@example.com", "pw")
    client = Client()
    client.force_login(admin)

    response = client.post(
        "/admin/automations/automation/",
        {"action": "delete_selected", "_selected_action": [str(first.pk), str(second.pk)], "post": "yes"},
    )

    assert response.status_code == 302
    assert Automation.objects.filter(pk__in=[first.pk, second.pk], archived_at__isnull=False).count() == 2
    assert not PeriodicTask.objects.filter(pk__in=tasks, enabled=True).exists()
    archived = AuditEvent.objects.filter(type="automation.archived").values_list(
        "refs__automation", flat=True
    )
    assert {str(first.pk), str(second.pk)} <= set(archived)

    response = client.post(
        "/admin/automations/automation/",
        {"action": "purge", "_selected_action": [str(first.pk), str(second.pk)]},
    )

    assert response.status_code == 302
    assert not Automation.objects.filter(pk__in=[first.pk, second.pk]).exists()
    assert not PeriodicTask.objects.filter(pk__in=tasks).exists()
    assert AuditEvent.objects.filter(type="automation.purged").count() == 2
