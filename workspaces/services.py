"""Writes for workspaces and memberships; each change is audited in its transaction."""

from __future__ import annotations

import ipaddress
import re
import uuid
import zoneinfo
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from audit import writer
from config.errors import InvalidArgument, ServiceError

from . import api_tokens, denylist
from .models import MAX_APPROVALS, Autonomy, Membership, Role, TokenScope, Workspace


def _trace() -> str:
    return uuid.uuid4().hex


@transaction.atomic
def workspace_get_or_create(*, slug: str, name: str = "", actor: str = "system") -> Workspace:
    workspace, created = Workspace.objects.get_or_create(slug=slug, defaults={"name": name or slug})
    if created:
        writer.append(
            trace_id=_trace(), type="workspace.created", summary=f"workspace {slug} created",
            workspace_id=workspace.id, actor=actor, refs={"workspace": workspace.slug},
        )  # fmt: skip
    return workspace


class LastAdmin(ServiceError):
    def __init__(self, workspace: Workspace, username: str, doing: str):
        super().__init__("LAST_ADMIN", f"{username} is the last admin of {workspace.slug}: make someone else "
                         f"admin before {doing} them", 409)  # fmt: skip


def _keep_an_admin(workspace: Workspace, membership: Membership, doing: str) -> None:
    """Refuse to leave a workspace that has an admin without one. The workspace row is locked
    first, so two admins demoting each other at once cannot both pass the count."""
    Workspace.objects.select_for_update().filter(pk=workspace.pk).first()
    if Membership.objects.filter(pk=membership.pk).values_list("role", flat=True).first() != Role.ADMIN:
        return
    others = Membership.objects.filter(workspace=workspace, role=Role.ADMIN).exclude(pk=membership.pk)
    if not others.exists():
        raise LastAdmin(workspace, membership.user.get_username(), doing)


@transaction.atomic
def membership_set_role(*, workspace: Workspace, user, role: str, actor: str = "system") -> Membership:
    if role not in Role.values:
        raise ValueError(f"unknown role {role!r}")
    membership, created = Membership.objects.get_or_create(
        workspace=workspace, user=user, defaults={"role": role}
    )
    previous = None if created else membership.role
    if previous != role:
        if previous is not None:
            _keep_an_admin(workspace, membership, "demoting")
        if not created:
            membership.role = role
            membership.save(update_fields=["role"])
        writer.append(
            trace_id=_trace(), type="operator.membership.role_changed",
            summary=f"{user.get_username()} is {role} in {workspace.slug}",
            workspace_id=workspace.id, actor=actor,
            payload={"user": user.get_username(), "role": role, "previous_role": previous},
        )  # fmt: skip
    return membership


_HOST = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")


def egress_allowlist_check(value: Any) -> list[str]:
    """A list of exact host names and IP addresses or CIDRs (as ``capabilities.egress`` reads them)."""
    if not isinstance(value, list):
        raise InvalidArgument(
            [{"path": "/egress_allowlist", "code": "invalid_type", "message": "a list of hosts or CIDRs"}]
        )
    errors, clean = [], []
    for index, entry in enumerate(value):
        text = entry.strip().lower().rstrip(".") if isinstance(entry, str) else ""
        valid = False
        if text:
            try:
                ipaddress.ip_network(text.strip("[]"), strict=False)
                valid = True
            except ValueError:
                legacy = denylist.legacy_ipv4(text)  # "2130706433", "0x7f000001": the address they are
                if legacy is not None:
                    text, valid = str(legacy), True
                else:
                    valid = len(text) <= 253 and bool(_HOST.match(text))
        if not valid:
            errors.append({"path": f"/egress_allowlist/{index}", "code": "invalid_host",
                           "message": f"{entry!r} is not a host name, an IP address or a CIDR"})  # fmt: skip
        elif (reason := denylist.denied_entry(text)) is not None:
            # Only the deployment's own settings may open what the platform denies.
            errors.append({"path": f"/egress_allowlist/{index}", "code": "egress_denied", "message": reason})
        else:
            clean.append(text)
    if errors:
        raise InvalidArgument(errors)
    return clean


def autonomy_check(value: Any, field: str = "default_autonomy") -> str:
    if not isinstance(value, str) or value not in Autonomy.values:
        raise InvalidArgument([{"path": f"/{field}", "code": "invalid_choice",
                                "message": f"{value!r} is not one of {', '.join(Autonomy.values)}"}])  # fmt: skip
    return value


def min_approvals_check(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_APPROVALS:
        raise InvalidArgument([{"path": "/min_approvals", "code": "out_of_range",
                                "message": f"min_approvals is a whole number from 1 to {MAX_APPROVALS}"}])  # fmt: skip
    return value


_HHMM = re.compile(r"^([01][0-9]|2[0-3]):([0-5][0-9])$")


def quiet_hours_check(value: Any) -> dict[str, str] | None:
    """``{"start": "HH:MM", "end": "HH:MM", "timezone": IANA}`` or None (no quiet hours)."""
    if value is None or value == {}:
        return None
    problems: list[tuple[str, str]] = []
    if not isinstance(value, Mapping):
        problems.append(
            ("", 'an object {"start": "HH:MM", "end": "HH:MM", "timezone": "Area/City"}, or null')
        )
    else:
        problems += [(str(key)[:64], "unknown key; quiet hours have start, end and timezone")
                     for key in sorted(map(str, set(value) - {"start", "end", "timezone"}))]  # fmt: skip
        for key in ("start", "end"):
            if not isinstance(value.get(key), str) or not _HHMM.match(value[key]):
                problems.append((key, "a time of day HH:MM, from 00:00 to 23:59"))
        zone = value.get("timezone")
        try:
            if not isinstance(zone, str) or not 0 < len(zone) <= 64:
                raise ValueError(zone)
            zoneinfo.ZoneInfo(zone)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
            problems.append(("timezone", f"{str(zone)[:64]!r} is not an IANA time zone (like Europe/Berlin)"))
        if not problems and value["start"] == value["end"]:
            problems.append(("end", "the window is empty: start and end are the same time"))
    if problems:
        raise InvalidArgument([{"path": "/quiet_hours" + (f"/{key}" if key else ""), "code": "invalid_quiet_hours",
                                "message": message} for key, message in problems])  # fmt: skip
    assert isinstance(value, Mapping)
    return {"start": value["start"], "end": value["end"], "timezone": value["timezone"]}


# The check of a workspace's argument policies needs the engine's filter grammar, which this app
# (below the engine) may not import: the engine registers it in its AppConfig.ready(). Until it
# does, no policy is accepted.
_policy_check: list[Callable[[Any], list[dict[str, str]]]] = []


def policies_check_register(check: Callable[[Any], list[dict[str, str]]]) -> None:
    _policy_check[:] = [check]


def policies_check(value: Any) -> list[Any]:
    """An ordered list of rules ``{when, then, reason}``; 400 naming the bad rule otherwise."""
    if not _policy_check:
        raise InvalidArgument([{"path": "/policies", "code": "invalid_policy",
                                "message": "policies cannot be checked here (the engine is not installed)"}])  # fmt: skip
    issues = _policy_check[0](value)
    if issues:
        raise InvalidArgument(issues)
    return list(value)


@transaction.atomic
def workspace_update(*, workspace: Workspace, user=None, name: str | None = None, four_eyes: bool | None = None,
                     egress_allowlist: Any = None, default_autonomy: str | None = None,
                     max_autonomy: str | None = None, min_approvals: int | None = None, policies: Any = None,
                     quiet_hours: Any = ...) -> Workspace:  # fmt: skip
    """Change a workspace's settings; one audit row naming what changed (before and after).

    Every value is checked before anything is written: one bad field changes nothing. The
    caller checks that the user administers the workspace (the API, the admin). The row is
    locked first, so two admins changing a ceiling at once are serialised: the last write
    wins, and each change is its own audit row with the value it replaced.
    """
    workspace = Workspace.objects.select_for_update().get(pk=workspace.pk)
    wanted: dict[str, Any] = {}
    if name is not None:
        wanted["name"] = name.strip() or workspace.slug
    if four_eyes is not None:
        wanted["four_eyes"] = bool(four_eyes)
    if egress_allowlist is not None:
        wanted["egress_allowlist"] = egress_allowlist_check(egress_allowlist)
    if default_autonomy is not None:
        wanted["default_autonomy"] = autonomy_check(default_autonomy)
    if max_autonomy is not None:
        wanted["max_autonomy"] = autonomy_check(max_autonomy, "max_autonomy")
    if min_approvals is not None:
        wanted["min_approvals"] = min_approvals_check(min_approvals)
    if policies is not None:
        wanted["policies"] = policies_check(policies)
    if quiet_hours is not ...:  # None clears the window
        wanted["quiet_hours"] = quiet_hours_check(quiet_hours)
    changes = {field: {"from": getattr(workspace, field), "to": value}
               for field, value in wanted.items() if getattr(workspace, field) != value}  # fmt: skip
    if not changes:
        return workspace
    for field, change in changes.items():
        setattr(workspace, field, change["to"])
    workspace.save(update_fields=list(changes))
    writer.append(
        trace_id=_trace(), type="operator.workspace.updated",
        summary=f"workspace {workspace.slug}: {', '.join(changes)} changed",
        workspace_id=workspace.id, actor=writer.actor_for(user), refs={"workspace": workspace.slug}, payload=changes,
    )  # fmt: skip
    return workspace


@transaction.atomic
def membership_remove(*, membership: Membership, actor: str = "system") -> None:
    workspace, username, role = membership.workspace, membership.user.get_username(), membership.role
    _keep_an_admin(workspace, membership, "removing")
    membership.delete()
    writer.append(
        trace_id=_trace(), type="operator.membership.removed", summary=f"{username} removed from {workspace.slug}",
        workspace_id=workspace.id, actor=actor, payload={"user": username, "previous_role": role},
    )  # fmt: skip


@transaction.atomic
def api_token_create(*, username: str, workspace_slug: str, role: str | None = None, actor: str = "system",
                     name: str | None = None, scope: str = TokenScope.FULL, expires_at: datetime | None = None,
                     replace: str | None = None) -> str:  # fmt: skip
    """Create the user, workspace and membership if missing; return a new API token (shown once).

    ``role`` None keeps a member's role and makes a new member a viewer, the least role: a token
    never makes anyone admin unless asked to. The user's other tokens stay (``replace`` names
    one to rotate).
    """
    user, _ = get_user_model().objects.get_or_create(username=username)
    workspace = workspace_get_or_create(slug=workspace_slug, actor=actor)
    if role is None:
        current = (
            Membership.objects.filter(workspace=workspace, user=user).values_list("role", flat=True).first()
        )
        role = current or Role.VIEWER
    membership_set_role(workspace=workspace, user=user, role=role, actor=actor)
    _, key = api_tokens.token_create(user=user, name=name, scope=scope, expires_at=expires_at, replace=replace,
                                     actor=actor, workspace_id=workspace.id)  # fmt: skip
    return key
