"""Rejected webhook fires: the failed-authentication limiter and the ledger's per-window summary.

Counts are kept per fixed window of ``AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS``
in :class:`~triggers.models.WebhookRejectionWindow`, one atomic upsert per count,
so they hold across processes on both databases. Only rejections write them: a
successful fire touches no table or cache key of this module.

Limiter (docs/security.md, "Failed webhook authentication"):

- per client address (``config.client_address``: ``REMOTE_ADDR``, or the
  ``X-Forwarded-For`` entry ``AUTOPLANE_TRUSTED_PROXY_HOPS`` from the right): past
  ``..._PER_ADDRESS`` failed authentications in a window, the address's *failed*
  attempts get 429 ``TOO_MANY_FAILURES`` with ``Retry-After`` (the seconds left in the
  window), uncounted, until the window ends; a valid token from it still fires;
- per automation: past ``..._PER_AUTOMATION`` failed authentications in a window
  (from any addresses), further *failed* attempts get 429 instead of 401, but a valid
  token still fires: a distributed attack never locks the legitimate sender out.

Ledger: the first ``AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED`` rejections addressed to
one automation (or, together, to ids that are no automation) in a window each get
their ``webhook.rejected`` row, as before; the rest are only counted. When the
window is over, one ``webhook.rejected`` summary row (``payload.aggregate``) records
how many there were: written by the next rejection for that automation or by the
``autoplane.webhook_rejections_summarize`` beat task, whichever comes first. Audit
rows are only ever appended; the window row is claimed (``summarized_at``) in the
summary's transaction, so each window is summarized once.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from audit import writer
from audit.models import Outcome

from .models import WebhookRejectionWindow

UNKNOWN_AUTOMATION = "-"
# Window rows are kept this many windows after they end (the summary is written long before).
KEEP_WINDOWS = 10


def clock() -> float:
    """Unix seconds now (tests pin it to keep a window from rolling under them)."""
    return time.time()


def window_length() -> int:
    return settings.AUTOPLANE_WEBHOOK_REJECTION_WINDOW_SECONDS


def current_window(now: float | None = None) -> int:
    return int((clock() if now is None else now) // window_length())


def retry_after(window: int, now: float | None = None) -> int:
    """Seconds until ``window`` ends (at least 1)."""
    now = clock() if now is None else now
    return max(1, int((window + 1) * window_length() - now + 0.999))


def _blocked_key(address: str, window: int) -> str:
    return f"autoplane:webhook-blocked:{window}:{address}"


def count(subject: str, window: int, *, workspace_id: int | None = None) -> tuple[int, bool]:
    """Count one more rejection for ``subject`` in ``window``: ``(count, already summarized)``."""
    table = connection.ops.quote_name(WebhookRejectionWindow._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (subject, window_start, count, workspace_id) VALUES (%s, %s, 1, %s) "  # noqa: S608
            f"ON CONFLICT (subject, window_start) DO UPDATE SET count = {table}.count + 1 "
            "RETURNING count, summarized_at",
            [subject[:100], window, workspace_id],
        )
        hits, summarized_at = cursor.fetchone()
    return hits, summarized_at is not None


# --- the limiter ----------------------------------------------------------------------------


def address_blocked(address: str, now: float | None = None) -> int | None:
    """``Retry-After`` seconds when ``address`` is blocked in this window, else None (one cache read)."""
    window = current_window(now)
    return retry_after(window, now) if cache.get(_blocked_key(address, window)) else None


def auth_failed(address: str, automation_ref: str, now: float | None = None) -> int | None:
    """Count a failed authentication; ``Retry-After`` seconds when it is past a limit, else None.

    Past the address limit the address is also marked blocked (in the cache) for the
    rest of the window, so its next failed attempts are refused uncounted.
    """
    window = current_window(now)
    per_address, _ = count(f"addr:{address}", window)
    per_automation, _ = count(f"automation:{automation_ref}", window)
    if per_address > settings.AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_ADDRESS:
        cache.set(_blocked_key(address, window), 1, timeout=retry_after(window, now) + 1)
        return retry_after(window, now)
    if per_automation > settings.AUTOPLANE_WEBHOOK_AUTH_FAILURES_PER_AUTOMATION:
        return retry_after(window, now)
    return None


# --- the ledger -----------------------------------------------------------------------------


def rejection_audit(
    *, automation_ref: str, workspace_id: int | None, actor: str, summary: str, refs: dict[str, Any],
    payload: dict[str, Any], secrets: list[str], now: float | None = None,
) -> bool:  # fmt: skip
    """Record one rejection: its own ``webhook.rejected`` row while the window's quota lasts,
    else only a count. Returns whether a row was written. Call inside a transaction."""
    window = current_window(now)
    hits, summarized = count(f"ledger:{automation_ref}", window, workspace_id=workspace_id)
    if hits == 1:
        summarize(automation_ref=automation_ref, before=window)
    audited = settings.AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED
    if hits > audited and not summarized:
        return False
    note = {"window_start": _window_time(window).isoformat(), "window_seconds": window_length()}
    if hits == audited:
        note["further"] = "further rejections in this window are counted in one summary row"
    writer.append(
        trace_id=uuid.uuid4().hex, type="webhook.rejected", outcome=Outcome.FAILURE, stage="trigger",
        summary=summary, workspace_id=workspace_id, actor=actor, refs=refs,
        payload={**payload, **note}, secrets=secrets,
    )  # fmt: skip
    return True


def _window_time(window: int) -> datetime:
    return datetime.fromtimestamp(window * window_length(), tz=UTC)


def summarize(*, automation_ref: str | None = None, before: int | None = None) -> int:
    """Write the summary row of every ended window with unrecorded rejections; returns how many.

    ``automation_ref`` limits it to one automation's windows. Each window is claimed
    (``summarized_at``) in the same transaction as its summary row, so a window is
    summarized once however many processes try.
    """
    before = current_window() if before is None else before
    audited = settings.AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED
    pending = WebhookRejectionWindow.objects.filter(
        window_start__lt=before, count__gt=audited, summarized_at__isnull=True
    )
    if automation_ref is not None:
        pending = pending.filter(subject=f"ledger:{automation_ref}")
    else:
        pending = pending.filter(subject__startswith="ledger:")
    written = 0
    for row in pending.order_by("window_start", "pk"):
        with transaction.atomic():
            claimed = WebhookRejectionWindow.objects.filter(pk=row.pk, summarized_at__isnull=True).update(
                summarized_at=timezone.now()
            )
            if not claimed:
                continue
            ref = row.subject.removeprefix("ledger:")
            start = _window_time(row.window_start)
            unrecorded = row.count - audited
            writer.append(
                trace_id=uuid.uuid4().hex, type="webhook.rejected", outcome=Outcome.FAILURE, stage="trigger",
                summary=(f"{row.count} webhook fires rejected in the {window_length()} s from "
                         f"{start.isoformat()} ({unrecorded} not recorded one by one)")[:500],
                workspace_id=row.workspace_id, actor="system",
                refs={"automation": "" if ref == UNKNOWN_AUTOMATION else ref},
                payload={"aggregate": True, "count": row.count, "recorded": audited, "unrecorded": unrecorded,
                         "window_start": start.isoformat(), "window_seconds": window_length()},
            )  # fmt: skip
            written += 1
    return written


def windows_summarize() -> int:
    """Beat: summarize ended windows, then forget old ones (their summaries are in the ledger)."""
    written = summarize()
    horizon = current_window() - KEEP_WINDOWS
    stale = WebhookRejectionWindow.objects.filter(window_start__lt=horizon)
    stale.exclude(subject__startswith="ledger:").delete()
    # A ledger window is forgotten only once summarized (or when nothing in it went unrecorded).
    stale.filter(subject__startswith="ledger:").exclude(
        count__gt=settings.AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED, summarized_at__isnull=True
    ).delete()
    return written
