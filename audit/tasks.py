"""Thin Celery tasks for the ledger: each calls a service."""

from __future__ import annotations

from celery import shared_task

from .anchors import truncate_all
from .checkpoints import checkpoint_write
from .sequencer import sequence_pending
from .verifications import verification_record
from .verify import all_chains


@shared_task(name="autoplane.audit_checkpoint", ignore_result=True, soft_time_limit=120, time_limit=180)
def audit_checkpoint(chain: str | None = None) -> int:
    """Beat runs this every AUTOPLANE_AUDIT_CHECKPOINT_SECONDS; a redelivery only re-signs an unmoved head.

    It sequences what is waiting first, so a checkpoint covers every entry committed
    before it even where no sequencer process runs.
    """
    sequence_pending()
    return len(checkpoint_write(chain))


@shared_task(name="autoplane.audit_truncate", ignore_result=True, soft_time_limit=3000, time_limit=3300)
def audit_truncate() -> int:
    """Hourly; does nothing unless AUTOPLANE_AUDIT_RETENTION_DAYS is set. Returns the rows deleted."""
    return sum(t.deleted for t in truncate_all())


@shared_task(name="autoplane.audit_verify", ignore_result=True, soft_time_limit=1500, time_limit=1800)
def audit_verify() -> bool:
    """Every AUTOPLANE_AUDIT_VERIFY_SECONDS: each chain verified from its newest checkpoint, results stored."""
    return verification_record(all_chains(), full=False).ok
