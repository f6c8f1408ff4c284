"""Matching domain events to event triggers (SPEC §6.3).

:func:`event_matched` is subscribed to the event bus in ``TriggersConfig.ready``;
it runs inside the ``autoplane.deliver_event`` task, which may deliver an event
more than once (late acks), so every dispatch is deduplicated on
``Dedupe(scope="trigger:<id>", key="event:<event id>")``.

An event is tested only against the enabled event triggers of its workspace that
subscribe to its ``event_type`` (an indexed lookup), so the cost of matching does
not depend on how many other triggers exist. Compiled filters are cached per
process by trigger id with the config hash they were compiled from: an edited
filter is compiled again, an unchanged one never is.

For each subscriber:

- its filter (if any) is evaluated on ``event.document()`` within the grammar's
  10 ms CPU budget; a filter past the budget is audited
  (``event.filter_budget_exceeded``) and starts no run;
- a match is dispatched with ``trigger_type="event"``, the event document as the
  trigger payload (``event`` in templates), inputs from ``input_mapping`` over the
  document (none without a mapping), and the event's ``trace_id``,
  ``parent_run_id`` and ``chain_depth``, so a chain of automations reads as one
  trace in the audit API;
- an event whose chain already passed ``MAX_CHAIN_DEPTH`` automations is not
  dispatched: ``event.chain_depth_exceeded`` is audited instead, so cycles stop.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import transaction

from audit import writer
from audit.models import Outcome
from automations.dispatcher import MAX_CHAIN_DEPTH, Dedupe, DispatchError, DispatchRequest, dispatch
from automations.events import Event
from automations.expressions.filter_grammar import (
    CompiledFilter,
    FilterBudgetExceeded,
    FilterError,
    compile_filter,
)
from automations.models import Automation, AutomationStatus

from .input_mapping import MappingError, map_inputs
from .models import Trigger, TriggerType

logger = logging.getLogger(__name__)

# Compiled filters per process, by trigger id: (config hash, compiled). An edited trigger
# replaces its own entry; the cache grows with the live triggers (never cleared wholesale,
# which made every delivery recompile every filter once a type had more than the limit),
# and past the limit it forgets the triggers that no longer exist.
MAX_CACHED_FILTERS = 4096

_cache: dict[Any, tuple[str, CompiledFilter | None]] = {}
_cache_lock = threading.Lock()
_cache_limit = MAX_CACHED_FILTERS


def compiled_filter(trigger_id: Any, config_hash: str, spec: Any) -> CompiledFilter | None:
    """The trigger's compiled filter (None: no filter, every event of the type matches)."""
    entry = _cache.get(trigger_id)
    if entry is not None and entry[0] == config_hash:
        return entry[1]
    compiled = compile_filter(spec) if spec is not None else None  # raises FilterError
    with _cache_lock:
        if trigger_id not in _cache and len(_cache) >= _cache_limit:
            _forget_deleted_triggers()
        _cache[trigger_id] = (config_hash, compiled)
    return compiled


def _forget_deleted_triggers() -> None:
    global _cache_limit
    live = set(Trigger.objects.filter(type=TriggerType.EVENT).values_list("pk", flat=True))
    for trigger_id in [key for key in _cache if key not in live]:
        del _cache[trigger_id]
    # Room for twice the live triggers, so the next sweep is as far away as this one.
    _cache_limit = max(MAX_CACHED_FILTERS, 2 * len(_cache))


def _subscribed(workspace_id: int, event_type: str):
    return Trigger.objects.filter(
        workspace_id=workspace_id, event_type=event_type, type=TriggerType.EVENT, enabled=True,
        automation__status=AutomationStatus.ACTIVE,
    )  # fmt: skip


def has_subscribers(workspace_id: int, event_type: str) -> bool:
    """One indexed lookup; the bus skips delivering events nobody subscribes to."""
    return _subscribed(workspace_id, event_type).exists()


def has_subscribers_sql() -> str:
    """:func:`has_subscribers` as an SQL boolean over two parameters (workspace id, event type),
    for the bus to decide inside the event row's own INSERT (``events.publish_statement``)."""
    return (
        f"EXISTS (SELECT 1 FROM {Trigger._meta.db_table} t JOIN {Automation._meta.db_table} a"  # noqa: S608
        f" ON a.id = t.automation_id WHERE t.workspace_id = %s AND t.event_type = %s"
        f" AND t.type = '{TriggerType.EVENT.value}' AND t.enabled AND a.status = '{AutomationStatus.ACTIVE.value}')"
    )


def subscribers(event: Event) -> list[Trigger]:
    return list(
        _subscribed(event.workspace_id, event.event_type)
        .only("id", "automation_id", "workspace_id", "key", "config", "config_hash")
        .order_by("pk")
    )


def _audit(event: Event, trigger: Trigger, type: str, summary: str, payload: dict[str, Any],
           outcome: str = Outcome.FAILURE) -> None:  # fmt: skip
    with transaction.atomic():
        writer.append(
            trace_id=event.trace_id, type=type, summary=f"trigger {trigger.key}: {summary}", outcome=outcome,
            workspace_id=event.workspace_id, stage="trigger",
            refs={"event": event.id, "trigger": str(trigger.pk), "automation": str(trigger.automation_id),
                  "parent_run": event.parent_run_id or ""},
            actor=f"event:{event.event_type}", payload={"event_type": event.event_type, **payload},
        )  # fmt: skip


def event_matched(event: Event) -> list[str]:
    """Dispatch every subscribed trigger whose filter passes; returns the ids of their runs."""
    run_ids = []
    for trigger in subscribers(event):
        run_id = _match_one(event, trigger)
        if run_id is not None:
            run_ids.append(run_id)
    return run_ids


def _match_one(event: Event, trigger: Trigger) -> str | None:
    document = event.document()
    try:
        compiled = compiled_filter(trigger.pk, trigger.config_hash, trigger.config.get("filter"))
        if compiled is not None and not compiled.matches(document):
            return None
    except FilterBudgetExceeded as exc:
        _audit(event, trigger, "event.filter_budget_exceeded", f"filter skipped: {exc}", {"budget_ms": 10})
        return None
    except FilterError as exc:  # saved before a grammar change made it invalid
        _audit(
            event, trigger, "event.filter_invalid", "filter does not compile", {"problems": str(exc)[:1000]}
        )
        return None
    if event.chain_depth >= MAX_CHAIN_DEPTH:
        _audit(event, trigger, "event.chain_depth_exceeded",
               f"not dispatched: the event's chain already passed {event.chain_depth} automations "
               f"(limit {MAX_CHAIN_DEPTH})", {"chain_depth": event.chain_depth, "limit": MAX_CHAIN_DEPTH},
               Outcome.SUPPRESSED)  # fmt: skip
        return None
    try:
        mapping = trigger.config.get("input_mapping")
        inputs = map_inputs(mapping, document) if mapping else {}
        result = dispatch(
            DispatchRequest(
                automation_id=trigger.automation_id, inputs=inputs, trigger_type="event", trigger_key=trigger.key,
                trigger_id=trigger.pk, trigger_payload=document, triggered_by=f"event:{event.event_type}",
                principal_ids=event.principal_ids,
                dedupe=Dedupe(scope=f"trigger:{trigger.pk}", key=f"event:{event.id}"), trace_id=event.trace_id,
                parent_run_id=event.parent_run_id, chain_depth=event.chain_depth,
                last_fired_at=trigger.last_fired_at or trigger.created_at,
            )
        )  # fmt: skip
    except MappingError as exc:
        _audit(event, trigger, "trigger.dispatch_failed", f"not dispatched: {exc}", {"code": "UNPROCESSABLE"})
        return None
    except DispatchError as exc:
        if exc.code == "CONFLICT":  # the same event is being dispatched by a redelivery right now
            return None
        type = "event.chain_depth_exceeded" if exc.code == "POLICY_VIOLATION" else "trigger.dispatch_failed"
        _audit(
            event,
            trigger,
            type,
            f"not dispatched: {exc.message}",
            {"code": exc.code, "errors": exc.errors or []},
        )
        return None
    if result.run is None:
        return None
    if result.created:
        Trigger.objects.filter(pk=trigger.pk).update(last_fired_at=result.run.created_at)
    return str(result.run.pk)
