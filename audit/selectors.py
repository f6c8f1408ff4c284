"""Reads of the ledger. Callers pass the workspace ids the reader may see; audit knows no users."""

from __future__ import annotations

from django.db.models import Q, QuerySet

from .models import AuditEvent


def audit_events(
    *,
    workspace_ids,
    trace_id: str | None = None,
    type: str | None = None,
    run: str | None = None,
) -> QuerySet[AuditEvent]:
    """Events of the given workspaces (ids or an id subquery), oldest first."""
    events = AuditEvent.objects.filter(workspace_id__in=workspace_ids)
    if trace_id:
        events = events.filter(trace_id=trace_id)
    if type:
        events = events.filter(type=type)
    if run:
        # refs.run is whatever id the engine wrote: match it as text or as a number.
        match = Q(refs__run=run)
        if run.isdigit():
            match |= Q(refs__run=int(run))
        events = events.filter(match)
    return events.order_by("id")
