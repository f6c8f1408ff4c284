"""Writes for triggers: syncing them from definitions, and their webhook credentials.

``triggers_sync`` and ``triggers_delete_for`` are registered as the engine's
``automation_saved_hooks`` / ``automation_deleted_hooks`` and run inside the
transaction that saves the automation. Token and secret operations are called
by the API and the admin alike; each is audited without the secret it creates.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from typing import Any

from cryptography.fernet import InvalidToken
from django.db import transaction
from django.utils import timezone

from audit import writer
from audit.models import Outcome
from automations.models import Automation, AutomationStatus
from capabilities.credentials import decrypt, encrypt
from config.errors import ServiceError

from . import schedules
from .models import Trigger, TriggerType

TOKEN_PREFIX = "apt_"  # noqa: S105 - a prefix, not a secret
SIGNING_SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
SIGNING_SECRET_BYTES = 32


class TriggerActionRefused(ServiceError):
    """An operation on a trigger that is refused (wrong type, revoked, ...)."""


def _audit(trigger: Trigger, type: str, summary: str, *, user=None, payload: dict[str, Any] | None = None,
           secrets: list[str] | None = None, outcome: str = Outcome.SUCCESS) -> None:  # fmt: skip
    writer.append(
        trace_id=uuid.uuid4().hex, type=type, summary=f"trigger {trigger.key}: {summary}", outcome=outcome,
        workspace_id=trigger.workspace_id, stage="trigger", actor=writer.actor_for(user),
        refs={"automation": str(trigger.automation_id), "trigger": str(trigger.pk)},
        payload={"key": trigger.key, "type": trigger.type, **(payload or {})}, secrets=secrets or [],
    )  # fmt: skip


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def config_hash(config: Any) -> str:
    return hashlib.sha256(writer.canonical_json(config).encode()).hexdigest()


# --- sync from the definition -------------------------------------------------------


def _wanted(automation: Automation) -> dict[str, dict[str, Any]]:
    active = automation.status == AutomationStatus.ACTIVE and automation.archived_at is None
    wanted = {}
    for spec in (automation.definition or {}).get("triggers") or []:
        config = spec.get("config") or {}
        wanted[spec["key"]] = {
            "type": spec["type"],
            "config": config,
            "config_hash": config_hash(config),
            "enabled": active and spec.get("enabled", True) is not False,
            "event_type": config.get("event_type", "") if spec["type"] == TriggerType.EVENT else "",
        }
    return wanted


def _delete(trigger: Trigger) -> None:
    if trigger.type == TriggerType.SCHEDULE:
        schedules.periodic_task_delete(trigger)
    trigger.delete()


def triggers_sync(automation: Automation) -> None:
    """Make the automation's Trigger rows match its definition and status.

    Identity (the row's id, hence its token, signing secret and history) is kept
    per ``key`` as long as the type stays the same; a key whose type changed is a
    new trigger.
    """
    with transaction.atomic():
        wanted = _wanted(automation)
        existing = {
            t.key: t for t in Trigger.objects.select_for_update().filter(automation=automation).order_by("pk")
        }
        for key, trigger in existing.items():
            if key not in wanted or wanted[key]["type"] != trigger.type:
                _audit(trigger, "trigger.deleted", "removed from the definition")
                _delete(trigger)
        for key, spec in wanted.items():
            current = existing.get(key)
            if current is None or current.type != spec["type"]:
                _create(automation, key, spec)
            else:
                _update(automation, current, spec)


def _create(automation: Automation, key: str, spec: dict[str, Any]) -> Trigger:
    trigger = Trigger.objects.create(
        automation=automation, workspace_id=automation.workspace_id, key=key, type=spec["type"],
        config=spec["config"], config_hash=spec["config_hash"], enabled=spec["enabled"],
        event_type=spec["event_type"],
        last_scheduled_for=schedules.schedule_baseline(spec["config"]) if spec["type"] == TriggerType.SCHEDULE else None,
    )  # fmt: skip
    if trigger.type == TriggerType.SCHEDULE:
        schedules.periodic_task_sync(trigger, automation_name=automation.name)
    _audit(trigger, "trigger.created", f"{trigger.type} trigger created" + ("" if trigger.enabled else " (disabled)"),
           payload={"enabled": trigger.enabled})  # fmt: skip
    return trigger


def _update(automation: Automation, trigger: Trigger, spec: dict[str, Any]) -> None:
    fields = [
        name
        for name in ("config", "config_hash", "enabled", "event_type")
        if getattr(trigger, name) != spec[name]
    ]
    if not fields and trigger.type != TriggerType.SCHEDULE:
        return
    if trigger.type == TriggerType.SCHEDULE:
        old = trigger.config
        timing_changed = (old.get("cron"), old.get("timezone")) != (
            spec["config"].get("cron"),
            spec["config"].get("timezone"),
        )
        if (spec["enabled"] and not trigger.enabled) or timing_changed:
            trigger.last_scheduled_for = schedules.schedule_baseline(spec["config"])
            fields.append("last_scheduled_for")
    enabled_changed = "enabled" in fields
    for name in fields:
        if name != "last_scheduled_for":
            setattr(trigger, name, spec[name])
    if fields:
        trigger.save(update_fields=[*fields, "updated_at"])
    if trigger.type == TriggerType.SCHEDULE and (fields or trigger.periodic_task_id is None):
        schedules.periodic_task_sync(trigger, automation_name=automation.name)
    if enabled_changed:
        state = "enabled" if trigger.enabled else "disabled"
        _audit(trigger, f"trigger.{state}", state, payload={"enabled": trigger.enabled})
    elif "config" in fields:
        _audit(trigger, "trigger.updated", "configuration changed")


def triggers_delete_for(automation: Automation) -> None:
    """The automation is being deleted: drop its triggers and their beat entries."""
    for trigger in Trigger.objects.select_for_update().filter(automation=automation).order_by("pk"):
        _delete(trigger)


# --- webhook tokens and signing secrets --------------------------------------------------


def _webhook(trigger: Trigger, *, for_update: bool = True) -> Trigger:
    trigger = Trigger.objects.select_for_update().get(pk=trigger.pk) if for_update else trigger
    if trigger.type != TriggerType.WEBHOOK:
        raise TriggerActionRefused(
            "INVALID_ARGUMENT", "only webhook triggers have tokens and signing secrets"
        )
    return trigger


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


@transaction.atomic
def trigger_token_rotate(*, trigger: Trigger, user=None) -> str:
    """A new bearer token for a webhook trigger, returned once; the previous one stops working."""
    trigger = _webhook(trigger)
    token = new_token()
    had_token = bool(trigger.token_hash)
    trigger.token_hash = token_hash(token)
    trigger.token_created_at = timezone.now()
    trigger.token_revoked_at = None
    trigger.token_rotated_by = user if user is not None and user.is_authenticated else None
    trigger.save(update_fields=["token_hash", "token_created_at", "token_revoked_at", "token_rotated_by",
                                "updated_at"])  # fmt: skip
    _audit(trigger, "trigger.token_rotated", "webhook token rotated" if had_token else "webhook token created",
           user=user, secrets=[token], payload={"replaced_previous": had_token})  # fmt: skip
    return token


@transaction.atomic
def trigger_token_revoke(*, trigger: Trigger, user=None) -> Trigger:
    """The token stops working; fires answer 401 until a new one is rotated in."""
    trigger = _webhook(trigger)
    if trigger.token_hash and trigger.token_revoked_at is None:
        trigger.token_revoked_at = timezone.now()
        trigger.save(update_fields=["token_revoked_at", "updated_at"])
        _audit(trigger, "trigger.token_revoked", "webhook token revoked", user=user)
    return trigger


def new_signing_secret() -> str:
    return SIGNING_SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SIGNING_SECRET_BYTES)).decode()


@transaction.atomic
def trigger_signing_secret_rotate(*, trigger: Trigger, user=None) -> str:
    """A new Standard Webhooks signing secret (``whsec_...``), returned once, stored encrypted."""
    trigger = _webhook(trigger)
    secret = new_signing_secret()
    had_secret = bool(trigger.signing_secret_encrypted)
    trigger.signing_secret_encrypted = encrypt({"secret": secret})
    trigger.signing_secret_created_at = timezone.now()
    trigger.save(update_fields=["signing_secret_encrypted", "signing_secret_created_at", "updated_at"])
    _audit(trigger, "trigger.signing_secret_rotated",
           "signing secret rotated" if had_secret else "signing secret created", user=user,
           secrets=[secret, secret.removeprefix(SIGNING_SECRET_PREFIX)], payload={"replaced_previous": had_secret})  # fmt: skip
    return secret


def trigger_signing_secret(trigger: Trigger) -> str | None:
    """The decrypted signing secret, or None when there is none (or no key decrypts it)."""
    if not trigger.signing_secret_encrypted:
        return None
    try:
        return decrypt(trigger.signing_secret_encrypted).get("secret")
    except (InvalidToken, ValueError):
        return None
