"""Stored verification results: what ``GET /api/v1/audit/verify`` serves instead of a walk.

A walk of the whole ledger costs seconds per million events, too much for every viewer's
request. So each chain's last result is kept (:class:`audit.models.AuditVerification`):

* the ``autoplane.audit_verify`` beat task verifies every chain incrementally (from its
  newest signed checkpoint, :func:`audit.verify.verify_chain`'s ``since_checkpoint``) every
  ``AUTOPLANE_AUDIT_VERIFY_SECONDS`` and records the results;
* a read serves the recorded results with their time; a chain with no result, or one older
  than ``AUTOPLANE_AUDIT_VERIFY_SECONDS``, is verified incrementally first (the cost of the
  events since its newest checkpoint);
* a full walk (every row, every signature) is for admins, at most one per chain every
  ``AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS``; ``manage.py audit_verify`` is not limited.

A broken result is kept until a full walk finds the chain intact: an incremental walk
starts above the damage and would not see it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from config.errors import ServiceError

from .models import AuditVerification
from .verify import BrokenLink, VerifyResult, verify_chain


def verification_record(chains: Iterable[str], *, full: bool) -> VerifyResult:
    """Verify each chain now (all of it with ``full``, else from its newest checkpoint) and store the results."""
    total = VerifyResult()
    for chain in sorted(set(chains)):
        one = verify_chain(chain, since_checkpoint=not full)
        _store(chain, one, full=full)
        total.merge(one)
    return total


def _store(chain: str, result: VerifyResult, *, full: bool) -> None:
    now = timezone.now()
    row, _ = AuditVerification.objects.get_or_create(chain=chain)
    if not full and not row.ok and result.ok:
        # An incremental walk cannot clear a break below where it starts.
        row.verified_at = now
        row.save(update_fields=["verified_at"])
        return
    row.ok = result.ok
    row.events = result.events
    row.checkpoints = result.checkpoints
    row.waiting = result.waiting
    row.broken = asdict(result.broken) if result.broken else None
    row.full = full
    row.verified_at = now
    fields = ["ok", "events", "checkpoints", "waiting", "broken", "full", "verified_at"]
    if full:
        row.full_verified_at = now
        fields.append("full_verified_at")
    row.save(update_fields=fields)


def verification_latest(chains: Iterable[str]) -> tuple[VerifyResult, datetime | None, bool]:
    """(result, verified_at, full) of ``chains``'s last verifications, refreshing stale ones first.

    ``verified_at`` is the oldest of the chains' times (each was verified at least then);
    ``full`` is whether every chain's last walk was a full one."""
    names = sorted(set(chains))
    fresh_after = timezone.now() - timedelta(seconds=settings.AUTOPLANE_AUDIT_VERIFY_SECONDS)
    rows = {row.chain: row for row in AuditVerification.objects.filter(chain__in=names)}
    stale = [c for c in names if c not in rows or (rows[c].verified_at or fresh_after) <= fresh_after]
    if stale:
        verification_record(stale, full=False)
        rows = {row.chain: row for row in AuditVerification.objects.filter(chain__in=names)}
    result = VerifyResult()
    for name in names:
        row = rows[name]
        result.merge(
            VerifyResult(
                chains=[name], events=row.events, checkpoints=row.checkpoints, waiting=row.waiting,
                broken=BrokenLink(**row.broken) if row.broken else None,
            )
        )  # fmt: skip
    times = [at for name in names if (at := rows[name].verified_at) is not None]
    return result, (min(times) if times else None), bool(names) and all(rows[name].full for name in names)


def verification_full(chains: Iterable[str]) -> VerifyResult:
    """A full walk of ``chains`` now, at most once per chain per interval: else 429 with ``Retry-After``."""
    names = sorted(set(chains))
    interval = timedelta(seconds=settings.AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS)
    now = timezone.now()
    AuditVerification.objects.bulk_create([AuditVerification(chain=c) for c in names], ignore_conflicts=True)
    with transaction.atomic():
        due = Q(full_requested_at__isnull=True) | Q(full_requested_at__lte=now - interval)
        recent = [
            at for at in AuditVerification.objects.filter(chain__in=names).exclude(due)
            .values_list("full_requested_at", flat=True) if at is not None
        ]  # fmt: skip
        if recent:
            _too_soon(max(recent) + interval - now, interval)
        if AuditVerification.objects.filter(due, chain__in=names).update(full_requested_at=now) < len(names):
            # Another request claimed one of them since: raised inside the transaction, so the
            # claims this one made are rolled back.
            _too_soon(interval, interval)
    return verification_record(names, full=True)


def _too_soon(wait: timedelta, interval: timedelta) -> None:
    retry = max(1, math.ceil(wait.total_seconds()))
    raise ServiceError(
        "RATE_LIMITED",
        f"a full verification ran less than {interval.total_seconds():.0f} s ago; retry in {retry} s "
        "(the last verification is served without ?full=true)",
        429,
        headers={"Retry-After": str(retry)},
    )
