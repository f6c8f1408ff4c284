"""Schedule triggers (SPEC §6.1): cron slots, the beat entries, and the fire service.

Beat is only the clock. Each schedule trigger has one django-celery-beat
``PeriodicTask`` (a ``CrontabSchedule`` in the trigger's time zone) that sends
``autoplane.fire_schedule(trigger_id)``; :func:`schedule_fire` then decides what
that tick means, from the database alone:

- the **slot** of a fire is the latest cron slot at or before ``now`` in the
  trigger's time zone (as an aware UTC datetime); a run for it is dispatched with
  ``Dedupe(scope="trigger:<id>", key="slot:<slot iso>")``, so two beat processes,
  a beat restart or a redelivered message never create two runs for one slot (the
  ``DispatchKey`` unique constraint is the arbiter; the trigger row lock and
  ``last_scheduled_for`` make the loser a cheap no-op);
- slots after ``last_scheduled_for`` and before the current slot were **missed**
  (the platform was down); so is the current slot itself when the fire arrives
  more than ``MISFIRE_GRACE`` after it (beat catching up once after a restart).
  Missed slots follow the trigger's ``catch_up`` policy (default ``skip``):

  ``skip``            no runs; ``schedule.missed`` audited per slot
  ``run_once``        one run for all of them (its slot is the latest missed one),
                      audited as ``schedule.caught_up`` with the slots it covers
  ``run_all_capped``  one run per missed slot for the most recent 10, oldest first;
                      the older ones are audited as ``schedule.missed``

  At most ``MAX_MISSED_AUDITED`` slots are audited one by one per fire; the rest go
  into one summary event (a year of a per-minute schedule is not 500,000 rows).

**Quiet hours.** A trigger whose config says ``"quiet_hours": "skip"`` does not fire while its
workspace's quiet hours hold (read at the moment of firing, on the window's own wall clock): each
slot it would have run is audited as ``schedule.skipped`` and accounted for like a fired one.

``$last_fired_at`` is the slot of the previous run of this trigger (slot times, not
wall-clock times, so consecutive "since" windows meet exactly).

When a trigger is created, re-enabled, or its cron or time zone changes,
``last_scheduled_for`` is reset to the current slot: slots that passed while a
trigger was paused were not *missed*, they were not wanted.

The beat crontab mirrors the cron expression where Celery's crontab means the same
thing. Where it may not (day-of-month *and* day-of-week both restricted — cron ORs
them, Celery ANDs them — or croniter extensions like ``L`` and ``#``) the beat entry
fires on a superset of days and the fire service, which uses croniter, no-ops on
ticks that are not slots.
"""

from __future__ import annotations

import json
import logging
import uuid
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from croniter import croniter
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django_celery_beat.models import CrontabSchedule, PeriodicTask

from audit import writer
from audit.models import Outcome
from automations.dispatcher import Dedupe, DispatchError, DispatchRequest, dispatch
from automations.gate_policies import quiet_hours_holding
from automations.models import Automation, AutomationStatus
from config.celery import QUEUE_DEFAULT
from workspaces.models import Workspace

from .models import Trigger, TriggerType

logger = logging.getLogger(__name__)

FIRE_TASK = "autoplane.fire_schedule"
CATCH_UP_POLICIES = ("skip", "run_once", "run_all_capped")
DEFAULT_CATCH_UP = "skip"
CATCH_UP_CAP = 10
MAX_MISSED_SCAN = 10_000
MAX_MISSED_AUDITED = 100


def misfire_grace() -> timedelta:
    return timedelta(seconds=settings.AUTOPLANE_SCHEDULE_MISFIRE_GRACE_SECONDS)


# --- cron slots -----------------------------------------------------------------


def trigger_timezone(config: dict[str, Any]) -> zoneinfo.ZoneInfo:
    return zoneinfo.ZoneInfo(config.get("timezone") or "UTC")


def slot_at_or_before(cron: str, tz: zoneinfo.ZoneInfo, now: datetime) -> datetime:
    """The latest slot <= ``now``, as aware UTC."""
    # croniter's get_prev is strictly before its start, and slots are whole minutes.
    local = (now + timedelta(microseconds=1)).astimezone(tz)
    return croniter(cron, local).get_prev(datetime).astimezone(UTC)


def slot_after(cron: str, tz: zoneinfo.ZoneInfo, moment: datetime) -> datetime:
    """The first slot > ``moment``, as aware UTC."""
    return croniter(cron, moment.astimezone(tz)).get_next(datetime).astimezone(UTC)


def slots_between(
    cron: str, tz: zoneinfo.ZoneInfo, after: datetime, before: datetime, *, limit: int = MAX_MISSED_SCAN
) -> tuple[list[datetime], bool]:
    """Slots with ``after < slot < before``, oldest first, at most ``limit`` (the most recent
    ones); the flag says whether older ones were left out."""
    found: list[datetime] = []
    it = croniter(cron, before.astimezone(tz))
    while True:
        slot = it.get_prev(datetime).astimezone(UTC)
        if slot <= after:
            return found[::-1], False
        if len(found) == limit:
            return found[::-1], True
        found.append(slot)


def next_fire_at(trigger: Trigger, now: datetime | None = None) -> datetime | None:
    if trigger.type != TriggerType.SCHEDULE or not trigger.enabled:
        return None
    try:
        return slot_after(trigger.config["cron"], trigger_timezone(trigger.config), now or timezone.now())
    except (KeyError, ValueError, zoneinfo.ZoneInfoNotFoundError):
        return None


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


# --- beat entries -----------------------------------------------------------------


def crontab_fields(cron: str) -> dict[str, str]:
    """Celery crontab fields that fire on every slot of ``cron`` (and maybe more, see above)."""
    minute, hour, dom, month, dow = croniter(cron).expanded

    def field_text(values: list) -> str:
        if values == ["*"] or not all(isinstance(v, int) for v in values):
            return "*"
        return ",".join(str(v) for v in sorted(set(values)))

    fields = {
        "minute": field_text(minute),
        "hour": field_text(hour),
        "day_of_month": field_text(dom),
        "month_of_year": field_text(month),
        "day_of_week": field_text(dow),
    }
    if dom != ["*"] and dow != ["*"]:  # cron ORs the two, Celery ANDs them: fire daily, let croniter decide
        fields["day_of_month"] = fields["day_of_week"] = "*"
    return fields


def _crontab_for(cron: str, tz: zoneinfo.ZoneInfo) -> CrontabSchedule:
    fields = crontab_fields(cron)
    existing = CrontabSchedule.objects.filter(timezone=tz, **fields).order_by("pk").first()
    return existing or CrontabSchedule.objects.create(timezone=tz, **fields)


def _drop_crontab_if_unused(crontab_id: int | None) -> None:
    if crontab_id and not PeriodicTask.objects.filter(crontab_id=crontab_id).exists():
        CrontabSchedule.objects.filter(pk=crontab_id).delete()


def periodic_task_sync(trigger: Trigger, *, automation_name: str = "") -> None:
    """Create or update the beat entry of a schedule trigger; enabled mirrors the trigger.

    Instances are saved (never ``QuerySet.update``) so that django-celery-beat's
    change tracking tells running beat processes to reload.
    """
    crontab = _crontab_for(trigger.config["cron"], trigger_timezone(trigger.config))
    task = trigger.periodic_task
    old_crontab_id = task.crontab_id if task is not None else None
    if task is None:
        task = PeriodicTask(name=f"autoplane.trigger:{trigger.pk}", task=FIRE_TASK)
    task.crontab = crontab
    task.interval = task.solar = task.clocked = None
    task.kwargs = json.dumps({"trigger_id": str(trigger.pk)})
    task.queue = QUEUE_DEFAULT
    task.enabled = trigger.enabled
    task.description = f"schedule trigger '{trigger.key}' of {automation_name or trigger.automation_id}"[
        :2000
    ]
    task.save()
    if trigger.periodic_task_id != task.pk:
        trigger.periodic_task = task
        Trigger.objects.filter(pk=trigger.pk).update(periodic_task=task)
    if old_crontab_id != crontab.pk:
        _drop_crontab_if_unused(old_crontab_id)


def periodic_task_delete(trigger: Trigger) -> None:
    task = (
        PeriodicTask.objects.filter(pk=trigger.periodic_task_id).first() if trigger.periodic_task_id else None
    )
    if task is None:
        task = PeriodicTask.objects.filter(name=f"autoplane.trigger:{trigger.pk}").first()
    if task is not None:
        crontab_id = task.crontab_id
        task.delete()
        _drop_crontab_if_unused(crontab_id)


# --- firing -----------------------------------------------------------------------


@dataclass
class FireOutcome:
    status: str  # fired | caught_up | skipped | already_fired | disabled | not_found
    slot: datetime | None = None
    run_ids: list[str] = field(default_factory=list)
    missed: list[datetime] = field(default_factory=list)
    skipped: list[datetime] = field(default_factory=list)  # not run: quiet hours
    errors: list[str] = field(default_factory=list)


@dataclass
class _Firing:
    trigger: Trigger
    automation: Automation
    now: datetime
    trace_id: str
    outcome: FireOutcome
    last_fired_at: datetime | None
    _quiet: str | None = None  # the window's text while it holds, "" outside it; None: not read yet

    def quiet_hours(self) -> str:
        """Whether the trigger skips now: the window's text when it does, else ""."""
        if self._quiet is None:
            self._quiet = ""
            if self.trigger.config.get("quiet_hours") == "skip":
                window = (
                    Workspace.objects.filter(pk=self.automation.workspace_id)
                    .values_list("quiet_hours", flat=True)
                    .first()
                )
                self._quiet = quiet_hours_holding(window, self.now)
        return self._quiet

    def refs(self) -> dict[str, str]:
        return {"automation": str(self.automation.pk), "trigger": str(self.trigger.pk)}

    def audit(self, type: str, summary: str, payload: dict[str, Any], outcome: str = Outcome.INFO) -> None:
        writer.append(
            trace_id=self.trace_id, type=type, summary=f"{self.automation.name} / {self.trigger.key}: {summary}",
            outcome=outcome, workspace_id=self.automation.workspace_id, stage="trigger", refs=self.refs(),
            actor=f"schedule:{self.trigger.key}", payload=payload,
        )  # fmt: skip

    def audit_missed(self, slots: list[datetime], older_left_out: bool, reason: str) -> None:
        for slot in slots[-MAX_MISSED_AUDITED:]:
            self.audit("schedule.missed", f"slot {_iso(slot)} missed ({reason})",
                       {"scheduled_for": _iso(slot), "reason": reason}, Outcome.SUPPRESSED)  # fmt: skip
        not_listed = len(slots) - min(len(slots), MAX_MISSED_AUDITED)
        if not_listed or older_left_out:
            count = f"{'more than ' if older_left_out else ''}{not_listed}"
            self.audit(
                "schedule.missed", f"{count} earlier slots missed ({reason})",
                {"count": not_listed, "more": older_left_out, "until": _iso(slots[0]) if slots else None,
                 "reason": reason},
                Outcome.SUPPRESSED,
            )  # fmt: skip

    def run(self, slot: datetime, payload_extra: dict[str, Any] | None = None) -> None:
        """Dispatch the run of one slot (deduplicated on the slot), unless quiet hours skip it."""
        config = self.trigger.config
        quiet = self.quiet_hours()
        if quiet:
            self.outcome.skipped.append(slot)
            self.audit("schedule.skipped", f"slot {_iso(slot)} skipped: {quiet}",
                       {"scheduled_for": _iso(slot), "reason": "quiet_hours", "quiet_hours": quiet},
                       Outcome.SUPPRESSED)  # fmt: skip
            return
        payload = {
            "type": "schedule", "key": self.trigger.key, "scheduled_for": _iso(slot), "fired_at": _iso(self.now),
            **(payload_extra or {}),
        }  # fmt: skip
        try:
            result = dispatch(
                DispatchRequest(
                    automation_id=self.automation.pk, inputs=dict(config.get("inputs") or {}),
                    trigger_type="schedule", trigger_key=self.trigger.key, trigger_id=self.trigger.pk,
                    trigger_payload=payload, triggered_by=f"schedule:{self.trigger.key}",
                    dedupe=Dedupe(scope=f"trigger:{self.trigger.pk}", key=f"slot:{_iso(slot)}"),
                    last_fired_at=self.last_fired_at or self.trigger.created_at,
                )
            )  # fmt: skip
        except DispatchError as exc:
            if exc.code == "CONFLICT":  # another process is dispatching this very slot
                return
            self.outcome.errors.append(exc.code)
            self.audit("trigger.dispatch_failed", f"slot {_iso(slot)} not run: {exc.message}",
                       {"scheduled_for": _iso(slot), "code": exc.code, "errors": exc.errors or []},
                       Outcome.FAILURE)  # fmt: skip
            return
        if result.run is not None:
            self.outcome.run_ids.append(str(result.run.pk))
            self.last_fired_at = slot


def schedule_fire(*, trigger_id: Any, now: datetime | None = None) -> FireOutcome:
    """One beat tick for one schedule trigger: run the current slot and settle missed ones."""
    now = now or timezone.now()
    with transaction.atomic():
        automation_id = Trigger.objects.filter(pk=trigger_id).values_list("automation_id", flat=True).first()
        if automation_id is None:
            return FireOutcome("not_found")
        # Lock order everywhere: automation, then its triggers (as automation_update does).
        automation = Automation.objects.select_for_update(no_key=True).filter(pk=automation_id).first()
        trigger = Trigger.objects.select_for_update().filter(pk=trigger_id).first()
        if automation is None or trigger is None or trigger.type != TriggerType.SCHEDULE:
            return FireOutcome("not_found")
        if not trigger.enabled or automation.status != AutomationStatus.ACTIVE:
            return FireOutcome("disabled")
        config = trigger.config
        tz = trigger_timezone(config)
        slot = slot_at_or_before(config["cron"], tz, now)
        previous = trigger.last_scheduled_for
        outcome = FireOutcome("fired", slot=slot)
        if previous is not None and slot <= previous:
            outcome.status = "already_fired"
            return outcome
        late = now - slot > misfire_grace()
        missed: list[datetime] = []
        older_left_out = False
        if previous is not None:
            missed, older_left_out = slots_between(config["cron"], tz, previous, slot)
        if late:
            missed.append(slot)
        outcome.missed = missed
        firing = _Firing(trigger, automation, now, uuid.uuid4().hex, outcome, trigger.last_fired_at)
        if missed:
            _catch_up(firing, missed, older_left_out, config.get("catch_up") or DEFAULT_CATCH_UP)
            outcome.status = "caught_up"
        if not late:
            firing.run(slot)
            if outcome.skipped and not outcome.run_ids:
                outcome.status = "skipped"
        updated = Trigger.objects.filter(pk=trigger.pk, last_scheduled_for=previous).update(
            last_scheduled_for=slot, last_fired_at=firing.last_fired_at
        )
        if not updated:  # cannot happen under the row lock; refuse to double-account the slots
            raise RuntimeError(f"trigger {trigger.pk} changed while it was firing")
    return outcome


def _catch_up(firing: _Firing, missed: list[datetime], older_left_out: bool, policy: str) -> None:
    if policy == "run_once":
        firing.audit(
            "schedule.caught_up", f"{len(missed)}{'+' if older_left_out else ''} missed slot(s) run once",
            {"policy": policy, "count": len(missed), "more": older_left_out,
             "slots": [_iso(s) for s in missed[-MAX_MISSED_AUDITED:]]},
        )  # fmt: skip
        firing.run(missed[-1], {"catch_up": policy, "missed_slots": [_iso(s) for s in missed[-MAX_MISSED_AUDITED:]],
                                "missed_count": len(missed)})  # fmt: skip
    elif policy == "run_all_capped":
        ran, dropped = missed[-CATCH_UP_CAP:], missed[:-CATCH_UP_CAP]
        firing.audit(
            "schedule.caught_up", f"{len(ran)} missed slot(s) run, {len(dropped)}{'+' if older_left_out else ''} dropped",
            {"policy": policy, "count": len(ran), "dropped": len(dropped), "more": older_left_out,
             "slots": [_iso(s) for s in ran]},
        )  # fmt: skip
        if dropped or older_left_out:
            firing.audit_missed(dropped, older_left_out, f"over the catch-up cap of {CATCH_UP_CAP}")
        for slot in ran:
            firing.run(slot, {"catch_up": policy})
    else:
        firing.audit_missed(missed, older_left_out, "catch_up is skip")


def schedule_baseline(config: dict[str, Any], now: datetime | None = None) -> datetime | None:
    """The slot a newly (re-)enabled schedule counts as accounted for: the current one."""
    try:
        return slot_at_or_before(config["cron"], trigger_timezone(config), now or timezone.now())
    except (KeyError, ValueError, zoneinfo.ZoneInfoNotFoundError):
        return None
