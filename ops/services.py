"""Writes for the operational side: process heartbeats and first-start bootstrap."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.db import transaction
from django.utils import timezone

from workspaces.models import Role
from workspaces.services import api_token_create

from .models import Heartbeat

PRUNE_AFTER = timedelta(hours=1)


def heartbeat_record(
    *, name: str, kind: str, queues: list[str] | None = None, hostname: str = "", pid: int | None = None,
    started_at: datetime | None = None,
) -> None:  # fmt: skip
    now = timezone.now()
    Heartbeat.objects.update_or_create(
        name=name,
        defaults={"kind": kind, "queues": sorted(queues or []), "hostname": hostname, "pid": pid, "seen_at": now},
        create_defaults={
            "kind": kind, "queues": sorted(queues or []), "hostname": hostname, "pid": pid,
            "seen_at": now, "started_at": started_at or now,
        },
    )  # fmt: skip


def heartbeat_clear(*, name: str) -> None:
    """A process that stops cleanly says so at once instead of going stale."""
    Heartbeat.objects.filter(name=name).delete()


def heartbeats_prune(*, older_than: timedelta = PRUNE_AFTER) -> int:
    deleted, _ = Heartbeat.objects.filter(seen_at__lt=timezone.now() - older_than).delete()
    return deleted


@dataclass(frozen=True)
class Bootstrap:
    username: str
    password: str
    api_token: str
    workspace: str


@transaction.atomic
def platform_bootstrap(*, username: str = "admin", workspace_slug: str = "default", actor: str = "system:up"):
    """On an empty installation: an admin superuser with a random password, the
    default workspace with the admin as its admin, and an API token.

    Returns None when any user exists already: a second start never changes
    who can log in.
    """
    user_model = get_user_model()
    if user_model.objects.exists():
        return None
    password = secrets.token_urlsafe(12)
    user_model.objects.create_superuser(username=username, email="", password=password)
    token = api_token_create(username=username, workspace_slug=workspace_slug, role=Role.ADMIN, actor=actor,
                             name="up")  # fmt: skip
    return Bootstrap(username=username, password=password, api_token=token, workspace=workspace_slug)
