"""``send_email``: one message through Django's email framework (console in dev, SMTP in prod).

Sender: ``from`` may only be ``DEFAULT_FROM_EMAIL`` or a sender
``AUTOPLANE_EMAIL_ALLOWED_FROM`` lists (an address, or ``@example.com`` for a
domain); anything else is refused at save (``sender_not_allowed``) and, for a
templated or agent-chosen ``from``, at run (``POLICY_VIOLATION``): the platform's
relay sends as the organisation, so a step must not pick who it claims to be.

Failure mapping: if the connection cannot be opened nothing was sent
(``TEMPORARILY_UNAVAILABLE``); if the server definitively refused the message
(sender, recipients or data rejected) it was not delivered (4xx temporary,
5xx ``INVALID_ARGUMENT``); any other failure while sending may have happened
after the server accepted it (``OUTCOME_UNKNOWN``, not retryable).
"""

from __future__ import annotations

import hashlib
import logging
import smtplib
from collections.abc import Mapping
from email.utils import parseaddr
from typing import Any

from django.conf import settings
from django.core.mail import EmailMultiAlternatives, get_connection

from ..base import (
    ActionContext,
    ActionDefinition,
    Capability,
    Envelope,
    ErrorCode,
    Risk,
    SideEffect,
    StepFailure,
)

logger = logging.getLogger(__name__)

MAX_RECIPIENTS = 50
# Bare addresses only: no display names, no separators, no line breaks.
_ADDRESS = {"type": "string", "pattern": r"^[^\s@<>,;]+@[^\s@<>,;]+$", "maxLength": 254}
_ADDRESSES = {"type": "array", "items": _ADDRESS, "maxItems": MAX_RECIPIENTS}

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["to", "subject", "body"],
    "additionalProperties": False,
    "properties": {
        "to": {**_ADDRESSES, "minItems": 1},
        "cc": _ADDRESSES,
        "from": _ADDRESS,
        "subject": {"type": "string", "pattern": r"^[^\r\n]*$", "maxLength": 500},
        "body": {"type": "string", "maxLength": 200_000},
        "html_body": {"type": "string", "maxLength": 500_000},
    },
}


def sender_allowed(address: str) -> bool:
    """``address`` is DEFAULT_FROM_EMAIL's address or one AUTOPLANE_EMAIL_ALLOWED_FROM allows."""
    wanted = address.strip().lower()
    if not wanted or "@" not in wanted:
        return False
    if wanted == parseaddr(settings.DEFAULT_FROM_EMAIL)[1].lower():
        return True
    domain = "@" + wanted.rpartition("@")[2]
    for entry in settings.AUTOPLANE_EMAIL_ALLOWED_FROM:
        allowed = entry.strip().lower()
        if allowed.startswith("@") and domain == allowed:
            return True
        if allowed and not allowed.startswith("@") and parseaddr(allowed)[1] == wanted:
            return True
    return False


def _is_template(value: Any) -> bool:
    return isinstance(value, str) and any(marker in value for marker in ("{{", "{%", "{#"))


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    sender = config.get("from")
    if isinstance(sender, str) and not _is_template(sender) and not sender_allowed(sender):
        return [("/from", "sender_not_allowed",
                 f"{sender[:254]!r} is not an allowed sender (DEFAULT_FROM_EMAIL or AUTOPLANE_EMAIL_ALLOWED_FROM)")]  # fmt: skip
    return []


def _recipient_count(config: Mapping[str, Any]) -> int | None:
    to, cc = config.get("to"), config.get("cc", [])
    if not isinstance(to, list) or not isinstance(cc, list):
        return None  # templated: unknown until rendered
    return len(to) + len(cc)


def describe(config: Mapping[str, Any]) -> Capability:
    # Many recipients raise the risk once, by the risk policy's rule (approvals.policy),
    # which says so; only an unknown (templated) list is described as the worst case here.
    unknown = _recipient_count(config) is None
    return Capability(
        id="send_email",
        description="external_write to an unknown number of recipients" if unknown else "external_write",
        side_effects=frozenset({SideEffect.EXTERNAL_WRITE, SideEffect.USER_VISIBLE}),
        risk=Risk.HIGH if unknown else Risk.MEDIUM,
        idempotent=False,
        expected_duration_seconds=5.0,
    )


def _message_id(ctx: ActionContext, from_email: str) -> str:
    # Stable across retries of the same step, so mail systems that deduplicate
    # on Message-ID can drop a duplicate after an unknown outcome.
    digest = hashlib.sha256(ctx.idempotency_key.encode()).hexdigest()[:32]
    domain = from_email.rpartition("@")[2] or "autoplane.invalid"
    return f"<{digest}.autoplane@{domain}>"


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    from_email = config.get("from") or settings.DEFAULT_FROM_EMAIL
    if config.get("from") and not sender_allowed(str(config["from"])):
        raise StepFailure(ErrorCode.POLICY_VIOLATION,
                          f"'{str(config['from'])[:254]}' is not an allowed sender; nothing was sent", retryable=False)  # fmt: skip
    to, cc = list(config["to"]), list(config.get("cc") or [])
    connection = get_connection(fail_silently=False, timeout=ctx.timeout_seconds)
    message = EmailMultiAlternatives(
        subject=config["subject"],
        body=config["body"],
        from_email=from_email,
        to=to,
        cc=cc,
        headers={"Message-ID": _message_id(ctx, from_email)},
        connection=connection,
    )
    if config.get("html_body"):
        message.attach_alternative(config["html_body"], "text/html")

    try:
        connection.open()
    except (OSError, smtplib.SMTPException) as exc:
        logger.warning("send_email: could not open the mail connection: %r", exc)
        raise StepFailure(
            ErrorCode.TEMPORARILY_UNAVAILABLE, "the mail server is not reachable", detail=repr(exc)
        )
    try:
        sent = connection.send_messages([message])
    except (smtplib.SMTPSenderRefused, smtplib.SMTPRecipientsRefused, smtplib.SMTPDataError) as exc:
        temporary = 400 <= getattr(exc, "smtp_code", 0) < 500
        raise StepFailure(
            ErrorCode.TEMPORARILY_UNAVAILABLE if temporary else ErrorCode.INVALID_ARGUMENT,
            "the mail server refused the message",
            retryable=temporary,
            detail=repr(exc),
        )
    except (OSError, smtplib.SMTPException) as exc:
        logger.warning("send_email: failed while sending: %r", exc)
        raise StepFailure(
            ErrorCode.OUTCOME_UNKNOWN,
            "sending the email failed part-way; whether it was delivered is unknown",
            retryable=False,
            detail=repr(exc),
        )
    finally:
        try:
            connection.close()
        except Exception:  # the message is already handed over; a failed QUIT changes nothing
            logger.warning("send_email: closing the mail connection failed", exc_info=True)
    if not sent:
        raise StepFailure(ErrorCode.INTERNAL, "the email was not sent", retryable=False)
    recipients = len(to) + len(cc)
    return Envelope.success({"recipients": recipients}, summary=f"email sent to {recipients} recipient(s)")


ACTION = ActionDefinition(
    name="send_email",
    description="Send an email through the configured Django email backend.",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
    notifies=lambda config: [*(config.get("to") or []), *(config.get("cc") or [])],
    # A message half handed to the mail server may or may not go out: the hand-over finishes,
    # then the run stops.
    interruptible=False,
    as_tool=True,
)
