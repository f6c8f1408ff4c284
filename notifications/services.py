"""Channels, notices and their deliveries (issue 30). Views, admin, tasks and the engine's gate share these.

* ``channel_create`` / ``channel_update`` / ``channel_delete``: admin-managed, per workspace; URLs are
  checked by the egress guard when saved and again at every send.
* ``approval_requested``: called by the engine's gate when it creates an approval; records what to do
  about it over time (``ApprovalWatch``) and queues the first notice's deliveries after commit.
* ``delivery_attempt``: one try of one delivery (the ``autoplane.notify_deliver`` task retries it
  with backoff); every attempt is recorded on the row and audited.
* ``notifications_sweep``: reminders and escalations (beat), at most once per interval across
  processes (each is claimed by a conditional UPDATE), and re-sends deliveries whose message was lost.

No notice is sent once the approval is no longer pending: every attempt checks first.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import secrets as secrets_module
import ssl
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import mail
from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import IntegrityError, transaction
from django.db.models import F
from django.urls import reverse
from django.utils import timezone
from standardwebhooks import Webhook

from approvals import gate as approval_gates
from approvals import services as approval_services
from approvals.models import Approval, ApprovalStatus
from audit import writer
from audit.models import Outcome
from capabilities import credentials, egress
from capabilities.base import ErrorCode, StepFailure
from config.celery import app
from config.errors import InvalidArgument, ServiceError
from workspaces.access import has_permission
from workspaces.models import Membership, Permission, Role, Workspace

from .models import (
    ApprovalWatch,
    Channel,
    ChannelKind,
    Delivery,
    DeliveryStatus,
    Notice,
)

logger = logging.getLogger(__name__)

DELIVER_TASK = "autoplane.notify_deliver"
MAX_ATTEMPTS = 5
MAX_TARGETS = 50
SWEEP_BATCH = 500
# A pending delivery untouched this long lost its message (or its worker): the sweep sends it again.
RESEND_AFTER = timedelta(minutes=5)
ROLE_PREFIX = "role:"
WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 - the Standard Webhooks prefix, not a secret
EVENT_TYPES = {
    Notice.REQUESTED: "approval.requested",
    Notice.REMINDER: "approval.reminded",
    Notice.ESCALATION: "approval.escalated",
}
APPROVAL_SETTINGS = ("notify", "remind_after_seconds", "remind_every_seconds", "escalate_after_seconds",
                     "escalate_to", "on_expiry", "max_re_requests")  # fmt: skip
DEFAULT_MAX_RE_REQUESTS = 1


class NotificationError(ServiceError):
    """A refused channel operation, with a stable API code and HTTP status."""


# --- channels ---------------------------------------------------------------------------------


def _problem(path: str, message: str) -> InvalidArgument:
    return InvalidArgument([{"path": path, "code": "invalid", "message": message}], message)


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        raise _problem("/name", "name is required (at most 100 characters)")
    return name.strip()


def check_targets(targets: Any, path: str, *, usernames: bool = False) -> list[str]:
    """E-mail addresses, ``role:approver`` / ``role:admin`` (any role with ``usernames``), and usernames."""
    if not isinstance(targets, list) or len(targets) > MAX_TARGETS:
        raise _problem(path, f"must be a list of at most {MAX_TARGETS} recipients")
    roles = Role.values if usernames else (Role.APPROVER, Role.ADMIN)
    out: list[str] = []
    for index, target in enumerate(targets):
        if not isinstance(target, str) or not target.strip():
            raise _problem(f"{path}/{index}", "a recipient must be a non-empty string")
        target = target.strip()
        if target.startswith(ROLE_PREFIX):
            if target[len(ROLE_PREFIX) :] not in roles:
                raise _problem(
                    f"{path}/{index}", f"unknown role; use one of {', '.join(ROLE_PREFIX + r for r in roles)}"
                )
        elif "@" in target or not usernames:
            try:
                validate_email(target)
            except ValidationError:
                raise _problem(f"{path}/{index}", f"{target[:100]!r} is not an e-mail address")
        elif len(target) > 150:
            raise _problem(f"{path}/{index}", "a username has at most 150 characters")
        if target not in out:
            out.append(target)
    return out


def _check_url(workspace: Workspace, url: Any, path: str = "/url") -> str:
    if not isinstance(url, str) or not url.strip() or len(url) > 2000:
        raise _problem(path, "url is required (at most 2000 characters)")
    url = url.strip()
    try:
        egress.check_url(url, egress.effective_allowlist(workspace.egress_allowlist or ()))
    except StepFailure as exc:
        if exc.code == ErrorCode.POLICY_VIOLATION:
            raise NotificationError("POLICY_VIOLATION", exc.message, 400)
        if exc.code != ErrorCode.TEMPORARILY_UNAVAILABLE:  # a name that does not resolve now may later
            raise _problem(path, exc.message)
    return url


def new_webhook_secret() -> str:
    return WEBHOOK_SECRET_PREFIX + base64.b64encode(secrets_module.token_bytes(32)).decode()


def _secret(channel: Channel) -> dict[str, str]:
    return credentials.decrypt(channel.secret_encrypted) if channel.secret_encrypted else {}


def channel_url(channel: Channel) -> str:
    """Where a slack or webhook channel posts (the slack URL is decrypted for the send)."""
    return _secret(channel).get("url", "") if channel.kind == ChannelKind.SLACK else channel.url


def channel_url_hint(channel: Channel) -> str:
    """What the API and admin show of a channel's URL: a Slack webhook URL is a secret, so only its host."""
    if channel.kind == ChannelKind.SLACK:
        try:
            host = httpx.URL(channel_url(channel)).host
        except (httpx.InvalidURL, ValueError):
            host = ""
        return f"https://{host}/…" if host else ""
    return channel.url


def _audit_channel(channel: Channel, type: str, summary: str, user, **payload: Any) -> None:
    writer.append(
        trace_id=uuid.uuid4().hex, type=type, stage="notification", summary=summary,
        workspace_id=channel.workspace_id, actor=writer.actor_for(user),
        refs={"channel": str(channel.pk)}, payload={"kind": channel.kind, "name": channel.name, **payload},
    )  # fmt: skip


def _require_admin(user, workspace_id: int) -> None:
    if not has_permission(user, workspace_id, Permission.ADMINISTER):
        raise NotificationError(
            "PERMISSION_DENIED", "your role in this workspace does not allow managing channels", 403
        )


@transaction.atomic
def channel_create(
    *,
    workspace: Workspace,
    user,
    kind: Any,
    name: Any,
    to: Any = None,
    url: Any = None,
    superuser_ok: bool = False,
) -> tuple[Channel, str | None]:
    """A new channel and, for a webhook, its signing secret (shown once: only the encrypted form is kept)."""
    if not (superuser_ok and getattr(user, "is_superuser", False)):
        _require_admin(user, workspace.id)
    if kind not in ChannelKind.values:
        raise _problem("/kind", "kind must be one of email, slack, webhook")
    channel = Channel(workspace=workspace, kind=kind, name=_check_name(name), created_by=user)
    shown: str | None = None
    if kind == ChannelKind.EMAIL:
        if url not in (None, ""):
            raise _problem("/url", "an email channel has no url")
        channel.to = check_targets(to, "/to")
        if not channel.to:
            raise _problem("/to", "name at least one recipient")
    else:
        if to not in (None, []):
            raise _problem("/to", f"a {kind} channel has no 'to'; it posts to its url")
        checked = _check_url(workspace, url)
        if kind == ChannelKind.SLACK:
            channel.secret_encrypted = credentials.encrypt({"url": checked})
        else:
            channel.url = checked
            shown = new_webhook_secret()
            channel.secret_encrypted = credentials.encrypt({"secret": shown})
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise NotificationError("CONFLICT", f"a channel named {channel.name!r} already exists here", 409)
    _audit_channel(channel, "notification.channel.created", f"channel {channel.name} ({kind}) created", user)
    return channel, shown


@transaction.atomic
def channel_update(
    *, channel: Channel, user, changes: Mapping[str, Any], superuser_ok: bool = False
) -> Channel:
    if not (superuser_ok and getattr(user, "is_superuser", False)):
        _require_admin(user, channel.workspace_id)
    unknown = set(changes) - {"name", "to", "url", "enabled"}
    if unknown:
        raise _problem(
            f"/{sorted(unknown)[0]}", "this field cannot be changed (kind is fixed: make a new channel)"
        )
    if "name" in changes:
        channel.name = _check_name(changes["name"])
    if "enabled" in changes:
        if not isinstance(changes["enabled"], bool):
            raise _problem("/enabled", "enabled must be true or false")
        channel.enabled = changes["enabled"]
    if "to" in changes:
        if channel.kind != ChannelKind.EMAIL:
            raise _problem("/to", f"a {channel.kind} channel has no 'to'")
        channel.to = check_targets(changes["to"], "/to")
        if not channel.to:
            raise _problem("/to", "name at least one recipient")
    if "url" in changes:
        if channel.kind == ChannelKind.EMAIL:
            raise _problem("/url", "an email channel has no url")
        checked = _check_url(channel.workspace, changes["url"])
        if channel.kind == ChannelKind.SLACK:
            channel.secret_encrypted = credentials.encrypt({"url": checked})
        else:
            channel.url = checked
    try:
        with transaction.atomic():
            channel.save()
    except IntegrityError:
        raise NotificationError("CONFLICT", f"a channel named {channel.name!r} already exists here", 409)
    _audit_channel(channel, "notification.channel.updated", f"channel {channel.name} updated", user,
                   changed=sorted(changes))  # fmt: skip
    return channel


@transaction.atomic
def channel_delete(*, channel: Channel, user, superuser_ok: bool = False) -> None:
    if not (superuser_ok and getattr(user, "is_superuser", False)):
        _require_admin(user, channel.workspace_id)
    _audit_channel(channel, "notification.channel.deleted", f"channel {channel.name} deleted", user)
    channel.delete()


# --- who is told --------------------------------------------------------------------------------


def may_decide(approval: Approval, user) -> bool:
    """The member may still approve this (role, four-eyes, not already decided, still pending)."""
    if (
        user is None
        or not user.is_active
        or not has_permission(user, approval.workspace_id, Permission.APPROVE)
    ):
        return False
    return approval_services.approval_decide_refusal(approval=approval, user=user) is None


def resolve_targets(approval: Approval, targets: Iterable[str]) -> list[tuple[str, Any]]:
    """(address, member or None) for each recipient: a role is its members who may decide (four-eyes
    applied) and have an e-mail address; a username is that member; an address is itself (a member
    with that address gets their own one-click link if they may decide)."""
    User = get_user_model()
    members = {
        m.user_id: m
        for m in Membership.objects.filter(workspace_id=approval.workspace_id).select_related("user")
    }
    by_email = {m.user.email.lower(): m.user for m in members.values() if m.user.email and m.user.is_active}
    out: dict[str, Any] = {}
    for target in targets:
        if target.startswith(ROLE_PREFIX):
            role = target[len(ROLE_PREFIX) :]
            for m in members.values():
                if m.role == role and m.user.email and m.user.is_active:
                    # An approver four-eyes excludes is not asked to decide.
                    if role in (Role.APPROVER, Role.ADMIN) and not may_decide(approval, m.user):
                        continue
                    out.setdefault(m.user.email.lower(), m.user)
        elif "@" in target:
            user = by_email.get(target.lower())
            out.setdefault(target.lower(), user if user is not None and may_decide(approval, user) else None)
        else:
            user = User.objects.filter(username=target, is_active=True, pk__in=list(members)).first()
            if user is not None and user.email:
                out.setdefault(user.email.lower(), user if may_decide(approval, user) else None)
    return list(out.items())


# --- first notice ------------------------------------------------------------------------------


def approval_settings(step: Mapping[str, Any], execution: Mapping[str, Any] | None) -> dict[str, Any]:
    """The step's ``approval`` settings over the automation's ``execution.approval``."""
    merged: dict[str, Any] = {}
    for source in ((execution or {}).get("approval") or {}, step.get("approval") or {}):
        merged.update({k: v for k, v in source.items() if k in APPROVAL_SETTINGS})
    return merged


def re_request(request: Any, step: Mapping[str, Any], execution: Mapping[str, Any] | None) -> Any:
    """The step's approval expired: with ``on_expiry: re_request`` (and re-requests left) a new
    approval, whose notices go out as for the first (the caller sees ``created``); else None."""
    config = approval_settings(step, execution)
    if config.get("on_expiry") != "re_request":
        return None
    return approval_gates.request_again(
        request, max_re_requests=int(config.get("max_re_requests", DEFAULT_MAX_RE_REQUESTS))
    )


def approval_requested(
    *, approval_id: Any, step: Mapping[str, Any], execution: Mapping[str, Any] | None
) -> int:
    """The engine's gate created ``approval_id``: remember its reminder plan and queue the first notice.

    Never fails the gate: a problem here (in its own savepoint) is logged, and the approval waits as
    it would without channels."""
    try:
        with transaction.atomic():
            return _approval_requested(approval_id, step, execution)
    except Exception:
        logger.exception("could not queue the notices of approval %s", approval_id)
        return 0


def _approval_requested(
    approval_id: Any, step: Mapping[str, Any], execution: Mapping[str, Any] | None
) -> int:
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None:
        return 0
    config = approval_settings(step, execution)
    watch, created = ApprovalWatch.objects.get_or_create(
        approval=approval,
        defaults={
            "workspace_id": approval.workspace_id,
            "notify": list(config.get("notify") or []),
            "remind_after_seconds": config.get("remind_after_seconds"),
            "remind_every_seconds": config.get("remind_every_seconds"),
            "escalate_after_seconds": config.get("escalate_after_seconds"),
            "escalate_to": list(config.get("escalate_to") or []),
        },
    )
    if not created:
        return 0
    return fan_out(approval, Notice.REQUESTED, extra=watch.notify)


def fan_out(approval: Approval, notice: str, *, extra: Iterable[str] = (), sequence: int = 0,
            channels: bool = True) -> int:  # fmt: skip
    """Create the deliveries of one notice and send them after commit; returns how many."""
    rows: list[Delivery] = []
    seen: set[str] = set()

    def email(address: str, user, channel: Channel | None) -> None:
        if address in seen:
            return
        seen.add(address)
        rows.append(Delivery(approval=approval, workspace_id=approval.workspace_id, channel=channel,
                             kind=ChannelKind.EMAIL, address=address, user=user, notice=notice,
                             sequence=sequence))  # fmt: skip

    if channels:
        for channel in Channel.objects.filter(workspace_id=approval.workspace_id, enabled=True):
            if channel.kind == ChannelKind.EMAIL:
                for address, user in resolve_targets(approval, channel.to):
                    email(address, user, channel)
            else:
                rows.append(Delivery(approval=approval, workspace_id=approval.workspace_id, channel=channel,
                                     kind=channel.kind, notice=notice, sequence=sequence))  # fmt: skip
    for address, user in resolve_targets(approval, extra):
        email(address, user, None)
    made = []
    for row in rows:
        try:
            with transaction.atomic():
                row.save(force_insert=True)
            made.append(str(row.pk))
        except IntegrityError:  # this notice was already queued for that destination
            continue
    if made:
        transaction.on_commit(lambda: _send_all(made))
    return len(made)


def _send_all(delivery_ids: list[str]) -> None:
    for delivery_id in delivery_ids:
        send(delivery_id)


def send(delivery_id: str) -> None:
    try:
        app.send_task(DELIVER_TASK, args=[delivery_id], ignore_result=True)
    except Exception:  # a broker outage must not fail the gate: the sweep sends it again
        logger.warning("could not queue notification delivery %s", delivery_id, exc_info=True)


# --- what a notice says -------------------------------------------------------------------------


def public_url(path: str) -> str:
    return settings.AUTOPLANE_PUBLIC_URL.rstrip("/") + path


def approval_page_url(approval: Approval) -> str:
    return public_url(reverse("admin:approvals_approval_change", args=[approval.pk]))


def content(approval: Approval, notice: str) -> dict[str, Any]:
    """The notice's facts: automation, step, what will run (already redacted on the approval), risk,
    why, expiry and the approval page."""
    return {
        "notice": notice,
        "approval_id": str(approval.pk),
        "run_id": str(approval.run_id),
        "automation_id": str(approval.automation_id),
        "automation": approval.automation_name,
        "step": approval.step_id,
        "action": approval.action,
        "capability": approval.capability_id,
        "what": approval.what,
        "risk": approval.risk,
        "reasons": list(approval.reasons or []),
        "why": approval.why,
        "message": approval.message,
        "requested_by": approval.requested_by,
        "approvals_required": approval.approvals_required,
        "expires_at": approval.expires_at.isoformat(),
        "approval_url": approval_page_url(approval),
    }


_HEADINGS = {
    Notice.REQUESTED: "Approval needed",
    Notice.REMINDER: "Reminder: approval still needed",
    Notice.ESCALATION: "Escalated: approval still needed",
}


def _summary(facts: Mapping[str, Any]) -> str:
    return f"{_HEADINGS[facts['notice']]}: {facts['automation']} / {facts['step']} ({facts['risk']} risk)"


def email_message(approval: Approval, delivery: Delivery, link: str | None) -> mail.EmailMessage:
    facts = content(approval, delivery.notice)
    what = json.dumps(facts["what"], indent=2, sort_keys=True, ensure_ascii=False)
    lines = [
        _summary(facts), "",
        f"Automation: {facts['automation']}",
        f"Step: {facts['step']} ({facts['action']}, {facts['capability']})",
        f"Risk: {facts['risk']}",
        f"Why: {facts['why']}",
        *([f"Note: {facts['message']}"] if facts["message"] else []),
        f"Requested by: {facts['requested_by']}",
        f"Expires: {facts['expires_at']}", "",
        "What will run:", what, "",
    ]  # fmt: skip
    if link:
        lines += ["Review and approve (the link is yours, works once):", link, ""]
    lines += ["Open the approval:", facts["approval_url"]]
    return mail.EmailMessage(
        subject=f"[autoplane] {_summary(facts)}"[:250], body="\n".join(lines),
        from_email=settings.DEFAULT_FROM_EMAIL, to=[delivery.address],
        headers={"X-Autoplane-Approval": str(approval.pk)},
    )  # fmt: skip


def slack_message(approval: Approval, notice: str) -> dict[str, Any]:
    """Block Kit: the summary, the facts, and a button opening the approval page."""
    facts = content(approval, notice)
    what = json.dumps(facts["what"], sort_keys=True, ensure_ascii=False)
    if len(what) > 2500:
        what = what[:2500] + "…"
    return {
        "text": _summary(facts),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": _summary(facts)[:150]}},
            {"type": "section", "fields": [
                {"type": "mrkdwn", "text": f"*Automation*\n{facts['automation']}"},
                {"type": "mrkdwn", "text": f"*Step*\n{facts['step']} ({facts['action']})"},
                {"type": "mrkdwn", "text": f"*Risk*\n{facts['risk']}"},
                {"type": "mrkdwn", "text": f"*Expires*\n{facts['expires_at']}"},
            ]},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*Why*: {facts['why'][:2800]}"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*What will run*\n```{what}```"}},
            {"type": "actions", "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": "Review and decide"},
                 "url": facts["approval_url"], "style": "primary", "action_id": "open_approval"},
            ]},
        ],
    }  # fmt: skip


def webhook_body(approval: Approval, delivery: Delivery) -> dict[str, Any]:
    return {
        "type": EVENT_TYPES[Notice(delivery.notice)],
        "timestamp": timezone.now().isoformat(),
        "data": content(approval, delivery.notice),
    }


# --- delivering ---------------------------------------------------------------------------------


class _Failed(Exception):
    def __init__(self, message: str, *, final: bool = False):
        super().__init__(message)
        self.message = message
        self.final = final


@functools.cache
def _tls() -> ssl.SSLContext:
    """One verifying TLS context per process: building one loads the CA bundle (~30 ms), and each
    EgressClient would build two for every delivery."""
    return httpx.create_ssl_context(trust_env=False)


def _post(workspace: Workspace, url: str, body: bytes, headers: Mapping[str, str]) -> None:
    timeout = float(settings.AUTOPLANE_NOTIFY_TIMEOUT_SECONDS)
    allowlist = egress.effective_allowlist(workspace.egress_allowlist or ())
    try:
        with egress.EgressClient(allowlist, verify=_tls()) as client:
            with client.stream("POST", url, content=body, timeout=httpx.Timeout(timeout),
                               headers={"Content-Type": "application/json", **headers}) as response:  # fmt: skip
                response.read()
                status = response.status_code
    except StepFailure as exc:
        raise _Failed(exc.message, final=exc.code in (ErrorCode.POLICY_VIOLATION, ErrorCode.INVALID_ARGUMENT))
    except httpx.HTTPError as exc:
        raise _Failed(f"{type(exc).__name__}: {str(exc)[:300]}")
    if not 200 <= status < 300:
        raise _Failed(
            f"the receiver answered HTTP {status}", final=400 <= status < 500 and status not in (408, 429)
        )


def _deliver(approval: Approval, delivery: Delivery) -> None:
    if delivery.kind == ChannelKind.EMAIL:
        link = None
        # A question is answered in the admin or the API: the one-click link only approves.
        if delivery.user is not None and approval.action != approval_services.QUESTION_ACTION:
            link = public_url(approval_services.approval_link_create(approval=approval, user=delivery.user))
        message = email_message(approval, delivery, link)
        try:
            message.send()
        except Exception as exc:  # SMTP and socket errors alike: retried
            raise _Failed(f"{type(exc).__name__}: {str(exc)[:300]}")
        return
    channel = delivery.channel
    if channel is None:
        raise _Failed("the channel was deleted", final=True)
    if delivery.kind == ChannelKind.SLACK:
        _post(
            approval.workspace,
            channel_url(channel),
            json.dumps(slack_message(approval, delivery.notice)).encode(),
            {},
        )
        return
    data = json.dumps(webhook_body(approval, delivery), sort_keys=True, ensure_ascii=False)
    signer = Webhook(_secret(channel)["secret"])
    now = timezone.now()
    msg_id = f"msg_{delivery.pk.hex}"  # the same id on every retry, so receivers can dedupe
    headers = {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signer.sign(msg_id, now, data),
    }
    _post(approval.workspace, channel.url, data.encode(), headers)


def _refs(delivery: Delivery, approval: Approval) -> dict[str, str]:
    refs = {"delivery": str(delivery.pk), "approval": str(approval.pk), "run": str(approval.run_id)}
    if delivery.channel_id:
        refs["channel"] = str(delivery.channel_id)
    return refs


def _destination(delivery: Delivery) -> str:
    if delivery.kind == ChannelKind.EMAIL:
        return delivery.address
    return f"{delivery.kind} channel {delivery.channel.name if delivery.channel else '(deleted)'}"


def delivery_attempt(delivery_id: Any) -> str:
    """Try one delivery once: ``delivered``, ``retry``, ``failed``, ``skipped`` or ``gone``."""
    delivery = (
        Delivery.objects.select_related("approval", "approval__workspace", "channel", "user")
        .filter(pk=delivery_id, status=DeliveryStatus.PENDING).first()
    )  # fmt: skip
    if delivery is None:
        return "gone"
    approval = delivery.approval
    now = timezone.now()
    why_skip = None
    if approval.status != ApprovalStatus.PENDING or approval.expires_at <= now:
        why_skip = f"the approval is already {approval.status if approval.status != 'pending' else 'expired'}"
    elif delivery.user is not None and not may_decide(approval, delivery.user):
        why_skip = f"{delivery.user.get_username()} may no longer decide on this approval"
    elif delivery.channel is not None and not delivery.channel.enabled:
        why_skip = "the channel is disabled"
    if why_skip:
        Delivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.SKIPPED, last_error=why_skip
        )
        return "skipped"
    if not Delivery.objects.filter(
        pk=delivery.pk, status=DeliveryStatus.PENDING, attempts=delivery.attempts
    ).update(attempts=F("attempts") + 1):
        return "gone"  # another process is on this attempt
    attempt = delivery.attempts + 1
    try:
        _deliver(approval, delivery)
    except (_Failed, approval_services.ApprovalError) as exc:
        message = exc.message
        final = attempt >= MAX_ATTEMPTS or getattr(exc, "final", True)
        _record_failure(delivery, approval, attempt, message, final)
        return "failed" if final else "retry"
    with transaction.atomic():
        Delivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.DELIVERED, delivered_at=timezone.now(), last_error=""
        )
        if delivery.channel_id:
            Channel.objects.filter(pk=delivery.channel_id).update(
                consecutive_failures=0, last_success_at=timezone.now()
            )
        writer.append(
            trace_id=approval.trace_id, type="notification.delivered", outcome=Outcome.SUCCESS,
            stage="notification", summary=f"{approval.step_id}: {delivery.notice} notice delivered to "
            f"{_destination(delivery)} (attempt {attempt})"[:500],
            workspace_id=approval.workspace_id, refs=_refs(delivery, approval),
            payload={"kind": delivery.kind, "notice": delivery.notice, "attempt": attempt},
        )  # fmt: skip
    return "delivered"


def _record_failure(delivery: Delivery, approval: Approval, attempt: int, message: str, final: bool) -> None:
    with transaction.atomic():
        Delivery.objects.filter(pk=delivery.pk).update(
            last_error=message[:2000], **({"status": DeliveryStatus.FAILED} if final else {})
        )
        if delivery.channel_id and final:
            Channel.objects.filter(pk=delivery.channel_id).update(
                consecutive_failures=F("consecutive_failures") + 1, last_error=message[:2000],
                last_failure_at=timezone.now(),
            )  # fmt: skip
        writer.append(
            trace_id=approval.trace_id, type="notification.failed", outcome=Outcome.FAILURE,
            stage="notification", summary=f"{approval.step_id}: {delivery.notice} notice to "
            f"{_destination(delivery)} failed (attempt {attempt}{', giving up' if final else ', will retry'})"[:500],
            workspace_id=approval.workspace_id, refs=_refs(delivery, approval),
            payload={"kind": delivery.kind, "notice": delivery.notice, "attempt": attempt, "final": final,
                     "error": message[:1000]},
        )  # fmt: skip


def retry_countdown(retries: int) -> float:
    """Seconds before the next attempt: exponential from ``AUTOPLANE_NOTIFY_RETRY_SECONDS``, capped."""
    return min(float(settings.AUTOPLANE_NOTIFY_RETRY_SECONDS) * (2**retries), 600.0)


# --- reminders and escalation ----------------------------------------------------------------


def _due_reminder(watch: ApprovalWatch, approval: Approval, now: datetime) -> bool:
    if watch.remind_after_seconds is None:
        return False
    if watch.last_reminded_at is None:
        return now >= approval.created_at + timedelta(seconds=watch.remind_after_seconds)
    if watch.remind_every_seconds is None:
        return False
    return now >= watch.last_reminded_at + timedelta(seconds=watch.remind_every_seconds)


def notifications_sweep(*, now: datetime | None = None) -> dict[str, int]:
    """Reminders and escalations that are due (beat). Each is claimed by a conditional UPDATE on the
    watch (``reminders_sent`` / ``escalated_at`` as read), so however many beats or workers run this at
    once, one reminder goes out per interval and one escalation per approval."""
    now = now or timezone.now()
    counts = {"reminded": 0, "escalated": 0, "closed": 0, "resent": 0}
    watches = ApprovalWatch.objects.filter(closed=False).select_related("approval").order_by("created_at")
    for watch in watches[:SWEEP_BATCH]:
        approval = watch.approval
        if approval.status != ApprovalStatus.PENDING or approval.expires_at <= now:
            counts["closed"] += ApprovalWatch.objects.filter(pk=watch.pk, closed=False).update(closed=True)
            continue
        if _due_reminder(watch, approval, now):
            with transaction.atomic():
                claimed = ApprovalWatch.objects.filter(
                    pk=watch.pk, reminders_sent=watch.reminders_sent, closed=False
                ).update(reminders_sent=watch.reminders_sent + 1, last_reminded_at=now)
                if claimed:
                    fan_out(approval, Notice.REMINDER, extra=watch.notify, sequence=watch.reminders_sent + 1)
                    approval_services.approval_event_publish(
                        approval, "approval.reminded", reminder=watch.reminders_sent + 1
                    )
                    counts["reminded"] += 1
        if (
            watch.escalate_after_seconds is not None
            and watch.escalated_at is None
            and now >= approval.created_at + timedelta(seconds=watch.escalate_after_seconds)
        ):
            with transaction.atomic():
                claimed = ApprovalWatch.objects.filter(
                    pk=watch.pk, escalated_at__isnull=True, closed=False
                ).update(escalated_at=now)
                if claimed:
                    fan_out(approval, Notice.ESCALATION, extra=watch.escalate_to)
                    approval_services.approval_event_publish(
                        approval, "approval.escalated", escalate_to=list(watch.escalate_to)
                    )
                    counts["escalated"] += 1
    clock = timezone.now()  # the wall clock: a message is lost after RESEND_AFTER of real time
    stale = Delivery.objects.filter(
        status=DeliveryStatus.PENDING, updated_at__lte=clock - RESEND_AFTER, attempts__lt=MAX_ATTEMPTS
    )
    for pk in stale.values_list("pk", flat=True)[:SWEEP_BATCH]:
        Delivery.objects.filter(pk=pk).update(updated_at=clock)
        send(str(pk))
        counts["resent"] += 1
    return counts


def failing_channels(workspace_ids: Iterable[int] | None = None):
    """Channels whose recent deliveries kept failing (the admin home shows them)."""
    from .models import FAILING_AFTER

    channels = Channel.objects.filter(consecutive_failures__gte=FAILING_AFTER).select_related("workspace")
    if workspace_ids is not None:
        channels = channels.filter(workspace_id__in=list(workspace_ids))
    return channels.order_by("-last_failure_at")
