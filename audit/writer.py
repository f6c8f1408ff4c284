"""The only way into the audit ledger.

Call :func:`append` inside the transaction that makes the change it records.
Each chain (one per workspace, plus ``platform``) is serialised by locking its
head row, so concurrent writers from many processes keep one valid chain while
different workspaces append in parallel.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.utils import timezone

from .models import AuditChainHead, AuditEvent, Outcome
from .redaction import redact

GENESIS_HASH = "0" * 64
HASHED_FIELDS = (
    "chain", "seq", "timestamp", "trace_id", "stage", "type", "summary",
    "outcome", "workspace_id", "refs", "actor", "payload", "prev_hash",
)  # fmt: skip


def chain_for(workspace_id: int | None) -> str:
    return f"ws-{workspace_id}" if workspace_id is not None else "platform"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, cls=DjangoJSONEncoder)


def event_hash(fields: dict[str, Any]) -> str:
    """sha256 over the canonical serialisation of the hashed fields (including ``prev_hash``)."""
    material = {name: fields[name] for name in HASHED_FIELDS}
    ts = material["timestamp"]
    material["timestamp"] = ts.isoformat(timespec="microseconds") if hasattr(ts, "isoformat") else ts
    return hashlib.sha256(canonical_json(material).encode()).hexdigest()


def _jsonable(value: Any) -> Any:
    return json.loads(canonical_json(value))


def _cap_payload(payload: dict[str, Any]) -> dict[str, Any]:
    text = canonical_json(payload)
    limit = settings.AUTOPLANE_AUDIT_MAX_PAYLOAD_BYTES
    if len(text.encode()) <= limit:
        return payload
    return {
        "truncated": True,
        "original_bytes": len(text.encode()),
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
        "preview": text[: min(2048, limit // 2)],
    }


def append(
    *,
    trace_id: str,
    type: str,
    summary: str,
    outcome: str = Outcome.INFO,
    workspace_id: int | None = None,
    stage: str = "",
    refs: dict[str, Any] | None = None,
    actor: str = "system",
    payload: dict[str, Any] | None = None,
    secrets: Iterable[str] = (),
) -> AuditEvent:
    """Append one event to its workspace's chain and return it.

    ``secrets`` are values (credential material, tokens) that must never be
    stored: every occurrence in summary, refs or payload becomes ``[REDACTED]``.
    """
    if not trace_id:
        raise ValueError("audit events require a trace_id")
    if outcome not in Outcome.values:
        raise ValueError(f"unknown audit outcome {outcome!r}")
    secrets = list(secrets)
    chain = chain_for(workspace_id)
    fields: dict[str, Any] = {
        "chain": chain,
        "trace_id": str(trace_id),
        "stage": stage,
        "type": type,
        "summary": redact(summary, secrets)[:500],
        "outcome": str(outcome),
        "workspace_id": workspace_id,
        "refs": _jsonable(redact(refs or {}, secrets)),
        "actor": str(actor)[:200],
        "payload": _cap_payload(_jsonable(redact(payload or {}, secrets))),
    }
    with transaction.atomic():
        head = AuditChainHead.objects.select_for_update().filter(chain=chain).first()
        if head is None:
            AuditChainHead.objects.get_or_create(chain=chain)
            head = AuditChainHead.objects.select_for_update().get(chain=chain)
        fields["seq"] = head.seq + 1
        fields["prev_hash"] = head.head_hash
        fields["timestamp"] = timezone.now()
        fields["hash"] = event_hash(fields)
        event = AuditEvent.objects.create(**fields)
        AuditChainHead.objects.filter(pk=head.pk).update(seq=fields["seq"], head_hash=fields["hash"])
    return event
