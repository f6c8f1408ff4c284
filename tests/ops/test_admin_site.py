"""The admin site: branded autoplane, and no out-of-band editing of schedules or API tokens."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import NoReverseMatch, reverse

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-root"))
    return client


def test_the_admin_is_branded_autoplane(superuser_client):
    body = superuser_client.get(reverse("admin:index")).content.decode()

    assert "<title>Operator console | autoplane</title>" in body
    assert '<a href="/admin/">autoplane</a>' in body
    assert "Django administration" not in body


def test_the_login_page_is_branded_autoplane():
    body = Client().get(reverse("admin:login")).content.decode()

    assert "autoplane" in body
    assert "Django administration" not in body


@pytest.mark.parametrize(
    "name",
    ["django_celery_beat_periodictask_changelist", "django_celery_beat_intervalschedule_changelist",
     "django_celery_beat_crontabschedule_changelist", "django_celery_beat_solarschedule_changelist",
     "django_celery_beat_clockedschedule_changelist", "authtoken_tokenproxy_changelist"],
)  # fmt: skip
def test_schedules_and_tokens_have_no_admin_pages(superuser_client, name):
    with pytest.raises(NoReverseMatch):
        reverse(f"admin:{name}")
    body = superuser_client.get(reverse("admin:index")).content.decode()
    assert "Periodic tasks" not in body
    assert "Crontabs" not in body
    assert "Tokens" not in body
