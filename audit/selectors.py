"""Reads of the ledger. Callers pass the workspace ids the reader may see; audit knows no users."""

from __future__ import annotations

from django.db import connection
from django.db.models import Q, QuerySet, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Left

from .models import KEY_PREFIX, AuditEvent, TypeKey


def audit_events(
    *,
    workspace_ids,
    trace_id: str | None = None,
    type: str | None = None,
    run: str | None = None,
) -> QuerySet[AuditEvent]:
    """Events of the given workspaces (a list of ids), oldest first."""
    events = AuditEvent.objects.filter(workspace_id__in=workspace_ids)
    if trace_id:
        events = of_trace(events, trace_id)
    if type:
        events = of_type(events, type)
    if run:
        events = of_run(events, run)
    return events.order_by("id")


def of_trace(events: QuerySet[AuditEvent], trace_id: str) -> QuerySet[AuditEvent]:
    """The events of trace ``trace_id``: the indexed prefix (audit_trace_prefix_idx), then the whole id."""
    return events.alias(trace_prefix=Left("trace_id", KEY_PREFIX)).filter(
        trace_prefix=trace_id[:KEY_PREFIX], trace_id=trace_id
    )


def of_type(events: QuerySet[AuditEvent], type_: str) -> QuerySet[AuditEvent]:
    """The events of type ``type_``: its hash (audit_type_key_idx, in id order), then the type itself."""
    if connection.vendor == "postgresql":
        return events.alias(type_key=TypeKey("type")).filter(type_key=TypeKey(Value(type_)), type=type_)
    return events.filter(type=type_)


def of_run(events: QuerySet[AuditEvent], run: str) -> QuerySet[AuditEvent]:
    """The events whose ``refs.run`` is ``run``."""
    if connection.vendor == "postgresql":
        # The very expression of the index audit_run_ref_key_idx (a prefix of refs ->> 'run'), so
        # the planner uses it, then the whole value; ->> gives a number as its text, so 41
        # matches "41" too.
        run_ref = KeyTextTransform("run", "refs")
        return events.alias(run_prefix=Left(run_ref, KEY_PREFIX), run_ref=run_ref).filter(
            run_prefix=run[:KEY_PREFIX], run_ref=run
        )
    # SQLite compares JSON values: match the id as text or as a number.
    match = Q(refs__run=run)
    if run.isdigit():
        match |= Q(refs__run=int(run))
    return events.filter(match)
