"""Quiet hours (approvals.policy.in_quiet_hours): read on the window's own wall clock, across midnight
and across a daylight-saving change; fixed datetimes, no clock. And the setting's check
(workspaces.services.quiet_hours_check): HH:MM and a real IANA zone, or a 400 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from approvals.policy import in_quiet_hours
from config.errors import ServiceError
from workspaces.services import quiet_hours_check

BERLIN_NIGHT = {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)


@pytest.mark.parametrize(
    ("moment", "inside"),
    [
        (utc(2026, 1, 15, 20, 59), False),  # 21:59 in Berlin (CET, UTC+1)
        (utc(2026, 1, 15, 21, 0), True),  # 22:00: the start is inside
        (utc(2026, 1, 15, 23, 30), True),  # 00:30 the next day: across midnight
        (utc(2026, 1, 16, 5, 59), True),  # 06:59
        (utc(2026, 1, 16, 6, 0), False),  # 07:00: the end is not
        (utc(2026, 1, 16, 12, 0), False),  # 13:00
    ],
)
def test_a_window_across_midnight(moment, inside):
    assert in_quiet_hours(BERLIN_NIGHT, moment) is inside


def test_the_window_follows_the_wall_clock_on_the_spring_dst_change():
    # 2026-03-29: Berlin goes from 02:00 CET to 03:00 CEST. 07:00 local is 06:00 UTC the day
    # before and 05:00 UTC that morning; 22:00 local is 21:00 UTC before and 20:00 UTC after.
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 28, 5, 30)) is True  # 06:30 CET
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 4, 59)) is True  # 06:59 CEST
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 5, 30)) is False  # 07:30 CEST: quiet hours over
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 0, 59)) is True  # 01:59 CET, just before the jump
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 1, 0)) is True  # 03:00 CEST, just after
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 20, 0)) is True  # 22:00 CEST
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 3, 29, 19, 59)) is False


def test_the_window_follows_the_wall_clock_on_the_autumn_dst_change():
    # 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice, both inside.
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 10, 25, 0, 30)) is True  # 02:30 CEST
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 10, 25, 1, 30)) is True  # 02:30 CET
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 10, 25, 5, 59)) is True  # 06:59 CET
    assert in_quiet_hours(BERLIN_NIGHT, utc(2026, 10, 25, 6, 0)) is False  # 07:00 CET


def test_a_window_inside_one_day_and_a_window_on_the_skipped_hour():
    lunch = {"start": "12:00", "end": "13:30", "timezone": "UTC"}
    assert in_quiet_hours(lunch, utc(2026, 5, 1, 12, 0)) is True
    assert in_quiet_hours(lunch, utc(2026, 5, 1, 13, 30)) is False
    assert in_quiet_hours(lunch, utc(2026, 5, 1, 11, 59)) is False
    # 02:15-02:45 Berlin does not exist on 2026-03-29: nothing is inside it that day, and no error.
    gap = {"start": "02:15", "end": "02:45", "timezone": "Europe/Berlin"}
    assert not any(in_quiet_hours(gap, utc(2026, 3, 29, 0, minute)) for minute in range(0, 60, 5))
    assert not any(in_quiet_hours(gap, utc(2026, 3, 29, 1, minute)) for minute in range(0, 60, 5))


def test_no_window_is_never_quiet():
    assert in_quiet_hours(None, utc(2026, 1, 1, 3, 0)) is False
    assert in_quiet_hours({}, utc(2026, 1, 1, 3, 0)) is False


def test_a_valid_setting_is_kept_as_given():
    assert quiet_hours_check(dict(BERLIN_NIGHT)) == BERLIN_NIGHT
    assert quiet_hours_check(None) is None


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"start": "24:00", "end": "07:00", "timezone": "UTC"}, "/quiet_hours/start"),
        ({"start": "7:00", "end": "07:00", "timezone": "UTC"}, "/quiet_hours/start"),
        ({"start": "22:00", "end": "07:60", "timezone": "UTC"}, "/quiet_hours/end"),
        ({"start": "22:00", "end": 700, "timezone": "UTC"}, "/quiet_hours/end"),
        ({"start": "22:00", "end": "07:00", "timezone": "Mars/Olympus"}, "/quiet_hours/timezone"),
        ({"start": "22:00", "end": "07:00", "timezone": "../../etc/passwd"}, "/quiet_hours/timezone"),
        ({"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin\x00"}, "/quiet_hours/timezone"),
        ({"start": "22:00", "end": "07:00", "timezone": "A" * 5000}, "/quiet_hours/timezone"),
        ({"start": "22:00", "end": "07:00"}, "/quiet_hours/timezone"),
        ({"start": "22:00", "end": "22:00", "timezone": "UTC"}, "/quiet_hours/end"),
        ({"start": "22:00", "end": "07:00", "timezone": "UTC", "days": ["Mon"]}, "/quiet_hours/days"),
        ("22:00-07:00", "/quiet_hours"),
        ([1, 2], "/quiet_hours"),
    ],
)
def test_a_bad_setting_is_a_400_naming_the_field(value, path):
    with pytest.raises(ServiceError) as caught:
        quiet_hours_check(value)
    assert caught.value.http_status == 400
    assert path in [error["path"] for error in caught.value.errors]


@pytest.mark.parametrize(
    "stored",
    [{"start": "22:00", "end": "07:00", "timezone": "Nowhere/Land"}, {"start": "late", "end": "07:00", "timezone": "UTC"},
     {"start": "22:00"}, ["22:00", "07:00"]],
)  # fmt: skip
def test_a_stored_window_that_cannot_be_read_counts_as_quiet(stored):
    from automations.gate_policies import quiet_hours_holding

    assert "quiet hours" in quiet_hours_holding(stored, utc(2026, 1, 15, 12, 0))
