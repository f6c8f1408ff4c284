"""The admin login is throttled per username and client address (django-axes, issue 32)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.test import Client

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "right-password-123"


@pytest.fixture
def admin_user(db, settings):
    settings.AXES_FAILURE_LIMIT = 3
    return get_user_model().objects.create_user(
        "operator", password=PASSWORD, is_staff=True, is_superuser=True
    )


def _login(password: str, *, username: str = "operator", address: str = "198.51.100.7", **extra):
    return Client().post(LOGIN, {"username": username, "password": password}, REMOTE_ADDR=address, **extra)


def _logged_in(response) -> bool:
    return response.status_code == 302 and response["Location"] == "/admin/"


def test_after_the_limit_of_bad_logins_the_right_password_is_refused_for_the_cool_off(admin_user):
    # given three bad passwords from one address
    statuses = [_login(f"wrong-{n}").status_code for n in range(3)]
    assert statuses[:2] == [200, 200]  # the form again, with its error

    # then the right one from that address is refused too, for the cool-off
    refused = _login(PASSWORD)
    assert refused.status_code == 429
    assert not _logged_in(refused)
    # and another address, or another username from the same address, is not locked out
    assert _logged_in(_login(PASSWORD, address="203.0.113.9"))
    assert _login("wrong", username="someone-else").status_code == 200


def test_a_good_login_before_the_limit_resets_the_count(admin_user):
    _login("wrong-1")
    _login("wrong-2")
    assert _logged_in(_login(PASSWORD))
    _login("wrong-3")
    _login("wrong-4")
    assert _logged_in(_login(PASSWORD))


def test_the_cool_off_ends(admin_user, settings):
    for n in range(3):
        _login(f"wrong-{n}")
    assert _login(PASSWORD).status_code == 429

    # when the cool-off has passed (the attempts are older than it)
    AccessAttempt.objects.update(attempt_time=AccessAttempt.objects.get().attempt_time - timedelta(hours=1))
    assert _logged_in(_login(PASSWORD))


def test_behind_a_proxy_the_lockout_is_per_forwarded_client(admin_user, settings):
    settings.AUTOPLANE_TRUSTED_PROXY_HOPS = 1
    for n in range(3):  # one client, spoofing left-most entries
        _login(f"wrong-{n}", address="10.0.0.2", HTTP_X_FORWARDED_FOR=f"6.6.6.{n}, 198.51.100.7")
    assert _login(PASSWORD, address="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.7").status_code == 429
    assert _logged_in(_login(PASSWORD, address="10.0.0.2", HTTP_X_FORWARDED_FOR="198.51.100.8"))
