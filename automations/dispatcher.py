"""The one path from "fire" (any trigger, or "Run now") to a queued Run (SPEC §7.1).

1. resolve inputs (payload, defaults incl. ``$`` tokens) and validate them;
2. estimate cost and refuse above ``budget_cap_usd``;
3. dedupe (idempotency key / schedule slot);
4. apply the concurrency policy (``concurrency.admit``, under a row lock on the automation);
5. snapshot the definition into a new Run (``queued``, with a ``trace_id``);
6. queue it (``enqueue.run_enqueue``: after commit, on the run's duration-class queue).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import Model
from django.utils import timezone
from jsonschema.protocols import Validator

from audit import writer
from audit.models import Outcome
from capabilities import json_schema
from config import instruments, one_round_trip
from config.celery import QUEUE_FAST, QUEUE_LONG, QUEUE_MEDIUM
from config.errors import ServiceError

from . import definition as defs
from .concurrency import Admission, admit, needs_lock
from .enqueue import run_enqueue
from .expressions import template
from .models import Automation, DispatchKey, Run, RunStatus
from .transitions import log_change

logger = logging.getLogger(__name__)

MAX_CHAIN_DEPTH = 8
DEDUPE_WINDOW = timedelta(hours=24)
FAST_BELOW_SECONDS = 10
MEDIUM_BELOW_SECONDS = 300


class DispatchError(ServiceError):
    """A fire the dispatcher refuses (bad inputs, budget, dedupe conflict, chain depth)."""


@dataclass
class Dedupe:
    scope: str  # the trigger's id, or "manual:<automation id>"
    key: str
    request_hash: str = ""


@dataclass
class DispatchRequest:
    automation_id: Any
    inputs: dict[str, Any] = field(default_factory=dict)
    trigger_type: str = "manual"
    trigger_key: str = ""
    trigger_id: Any = None
    trigger_payload: dict[str, Any] = field(default_factory=dict)
    triggered_by: str = "system"
    # user ids of the people behind the run (four-eyes); see Run.principal_ids
    principal_ids: tuple[int, ...] = ()
    dedupe: Dedupe | None = None
    trace_id: str | None = None
    parent_run_id: Any = None
    chain_depth: int = 0
    last_fired_at: datetime | None = None
    # The automation row when the caller already read it (a webhook's trigger lookup joins
    # it): dispatch then reads it again only under the concurrency lock, when there is one.
    automation: Automation | None = None
    # An UPDATE of one row (model, primary key, values) made in the transaction that creates
    # the run (a trigger's ``last_fired_at``), so the caller needs no transaction of its own.
    touch: tuple[type[Model], Any, dict[str, Any]] | None = None


@dataclass
class DispatchResult:
    run: Run | None
    created: bool = False
    deduplicated: bool = False
    suppressed: bool = False


def request_hash(body: Any) -> str:
    return hashlib.sha256(writer.canonical_json(body).encode()).hexdigest()


def queue_for(snapshot: dict[str, Any], workspace_id: int) -> str:
    steps = list(snapshot["plan"]) + list((snapshot.get("execution") or {}).get("on_failure") or [])
    longest = max((defs.step_duration_seconds(step, workspace_id) for step in steps), default=1.0)
    if longest < FAST_BELOW_SECONDS:
        return QUEUE_FAST
    if longest < MEDIUM_BELOW_SECONDS:
        return QUEUE_MEDIUM
    return QUEUE_LONG


def last_fired_at(request: DispatchRequest, automation: Automation) -> datetime:
    """``$last_fired_at``, defined on every run (docs/definition-format.md).

    A trigger's fire: the trigger's previous fire, which its caller passes (a trigger
    that never fired passes its own creation time). A run without a trigger (Run now,
    ``POST /run``): the automation's previous run, or its creation if it never ran.
    """
    if request.last_fired_at is not None:
        return request.last_fired_at
    previous = (
        Run.objects.filter(automation=automation).order_by("-created_at").values_list("created_at", flat=True)
    )
    return previous.first() or automation.created_at


_input_validators: dict[tuple[Any, int], tuple[dict[str, Any], Validator]] = {}
MAX_CACHED_VALIDATORS = 1024


def _input_validator(schema: dict[str, Any], automation: Automation) -> Validator:
    """The compiled input-schema validator of this automation version (a version's definition never changes)."""
    key = (automation.pk, automation.version)
    cached = _input_validators.get(key)
    if cached is not None and (cached[0] is schema or cached[0] == schema):
        return cached[1]
    validator = json_schema.validator(schema, formats=True)  # regexes in RE2 (capabilities/json_schema.py)
    if len(_input_validators) >= MAX_CACHED_VALIDATORS:
        _input_validators.clear()
    _input_validators[key] = (schema, validator)
    return validator


def resolve_inputs(
    snapshot: dict[str, Any], given: dict[str, Any], request: DispatchRequest, automation: Automation
) -> dict[str, Any]:
    schema = (snapshot.get("inputs") or {}).get("schema") or {"type": "object"}
    inputs = dict(given)
    tokens = {  # computed only when a default names them
        "$now": lambda: timezone.now().isoformat(),
        "$last_fired_at": lambda: last_fired_at(request, automation).isoformat(),
        "$creator": lambda: request.triggered_by,
    }
    for name, prop in (schema.get("properties") or {}).items():
        if name in inputs or not isinstance(prop, dict) or "default" not in prop:
            continue
        default = prop["default"]
        if isinstance(default, str) and default in tokens:
            inputs[name] = tokens[default]()
        else:
            inputs[name] = default
    errors = [
        {"path": "/inputs" + "".join(f"/{p}" for p in e.absolute_path), "code": "invalid_input",
         "message": e.message[:300]}
        for e in _input_validator(schema, automation).iter_errors(inputs)
    ]  # fmt: skip
    if errors:
        raise DispatchError(
            "INVALID_ARGUMENT", "inputs do not match the automation's input schema", errors=errors
        )
    return inputs


def estimate_cost(snapshot: dict[str, Any], workspace_id: int) -> Decimal:
    total = Decimal("0")
    for step in snapshot["plan"]:
        capability = defs.describe_step(step, workspace_id)
        if capability is not None:
            try:
                total += capability.estimate_cost(step.get("config") or {})
            except Exception:  # an estimate that needs rendered values is unknown until run time
                logger.debug("no cost estimate for step %s before rendering", step.get("step_id"))
    return total


def _concurrency_key(snapshot: dict[str, Any], inputs: dict[str, Any], payload: dict[str, Any]) -> str:
    source = (snapshot.get("execution") or {}).get("concurrency_key")
    if not source:
        return ""
    try:
        value = template.render(source, {"inputs": inputs, "trigger": payload})
    except template.TemplateError as exc:
        raise DispatchError(exc.code, f"concurrency_key: {exc.message}") from None
    return str(value)[:200]


def _claim_dedupe(dedupe: Dedupe) -> DispatchResult | None:
    """Insert the dedupe row; if the key is already taken, answer as the original run did."""
    now = timezone.now()
    DispatchKey.objects.filter(scope=dedupe.scope, key=dedupe.key, expires_at__lt=now).delete()
    try:
        with transaction.atomic():
            DispatchKey.objects.create(
                scope=dedupe.scope, key=dedupe.key, request_hash=dedupe.request_hash,
                expires_at=now + DEDUPE_WINDOW,
            )  # fmt: skip
        return None
    except IntegrityError:
        existing = DispatchKey.objects.filter(scope=dedupe.scope, key=dedupe.key).first()
    if existing is None or existing.run_id is None:
        raise DispatchError("CONFLICT", "a request with this idempotency key is still being processed", 409)
    if dedupe.request_hash and existing.request_hash != dedupe.request_hash:
        raise DispatchError("UNPROCESSABLE", "idempotency key reused with a different request body", 422)
    return DispatchResult(run=Run.objects.get(pk=existing.run_id), deduplicated=True)


def dispatch(request: DispatchRequest) -> DispatchResult:
    if request.chain_depth >= MAX_CHAIN_DEPTH:
        raise DispatchError("POLICY_VIOLATION", f"event chain deeper than {MAX_CHAIN_DEPTH} automations", 409)
    automation = request.automation
    if automation is None or automation.pk != request.automation_id:
        automation = Automation.objects.filter(pk=request.automation_id).first()
    if automation is None:
        raise DispatchError("NOT_FOUND", "automation not found", 404)
    if automation.archived_at is not None:
        raise DispatchError("CONFLICT", "the automation is archived", 409)
    snapshot = automation.definition
    inputs = resolve_inputs(snapshot, request.inputs, request, automation)
    execution = snapshot.get("execution") or {}
    cap = execution.get("budget_cap_usd")
    if cap is not None and estimate_cost(snapshot, automation.workspace_id) > Decimal(str(cap)):
        raise DispatchError("BUDGET_EXCEEDED", "estimated cost exceeds the automation's budget cap", 422)
    concurrency_key = _concurrency_key(snapshot, inputs, request.trigger_payload)
    trace_id = request.trace_id or uuid.uuid4().hex

    if request.dedupe is None and one_round_trip.available() and not needs_lock(automation):
        return _create_in_one_round_trip(request, automation, inputs, concurrency_key, trace_id)

    with transaction.atomic():
        if request.dedupe is not None:
            replay = _claim_dedupe(request.dedupe)
            if replay is not None:
                instruments.fired(trigger_type=request.trigger_type, result="replayed")
                return replay
        admission, automation = admit(automation, concurrency_key)
        if automation.archived_at is not None:  # archived while this dispatch was on its way
            raise DispatchError("CONFLICT", "the automation is archived", 409)
        if admission == Admission.DROP:
            writer.append(
                trace_id=trace_id, type="run.suppressed", outcome=Outcome.SUPPRESSED,
                summary=f"{automation.name}: dropped, a run is already active (drop_if_running)",
                workspace_id=automation.workspace_id, actor=request.triggered_by, refs=_actor_refs(request, automation),
                payload={"trigger_type": request.trigger_type, "concurrency_key": concurrency_key},
            )  # fmt: skip
            if request.dedupe is not None:
                DispatchKey.objects.filter(scope=request.dedupe.scope, key=request.dedupe.key).delete()
            instruments.fired(trigger_type=request.trigger_type, result="suppressed")
            return DispatchResult(run=None, suppressed=True)
        hold = admission == Admission.HOLD
        run = _new_run(request, automation, inputs, concurrency_key, trace_id, hold=hold)
        run.save(force_insert=True)
        if request.dedupe is not None:
            DispatchKey.objects.filter(scope=request.dedupe.scope, key=request.dedupe.key).update(run=run)
        if request.touch is not None:
            model, pk, values = request.touch
            model._default_manager.filter(pk=pk).update(**values)
        writer.append(**_created_event(request, automation, run, inputs, hold=hold))
        _created(request, automation, run, hold=hold)
    return DispatchResult(run=run, created=True)


def _create_in_one_round_trip(
    request: DispatchRequest,
    automation: Automation,
    inputs: dict[str, Any],
    concurrency_key: str,
    trace_id: str,
) -> DispatchResult:
    """The run, the caller's ``touch`` and ``run.created`` in one round trip and one transaction.

    What the atomic path does when there is nothing to dedupe and no concurrency
    limit to take a lock for (so nothing to read first): the same rows, sent as one
    multi-statement query (:mod:`config.one_round_trip`), and queued once it returned.
    """
    run = _new_run(request, automation, inputs, concurrency_key, trace_id, hold=False)
    statements = [one_round_trip.insert(run)]
    if request.touch is not None:
        statements.append(one_round_trip.update_row(*request.touch))
    statements.append(writer.statement(**_created_event(request, automation, run, inputs, hold=False)))
    one_round_trip.execute(statements)
    one_round_trip.mark_saved(run)
    _created(request, automation, run, hold=False)  # not in a transaction: queued now
    return DispatchResult(run=run, created=True)


def _actor_refs(request: DispatchRequest, automation: Automation) -> dict[str, str]:
    return {"automation": str(automation.pk), "trigger": str(request.trigger_id or "")}


def _new_run(request: DispatchRequest, automation: Automation, inputs: dict[str, Any], concurrency_key: str,
             trace_id: str, *, hold: bool) -> Run:  # fmt: skip
    snapshot = automation.definition
    run = Run(
        workspace_id=automation.workspace_id,
        automation=automation,
        automation_version=automation.version,
        status=RunStatus.QUEUED,
        inputs=inputs,
        trigger_type=request.trigger_type,
        trigger_key=request.trigger_key,
        trigger_id=request.trigger_id,
        trigger_payload=request.trigger_payload,
        triggered_by=request.triggered_by,
        principal_ids=sorted({int(pk) for pk in request.principal_ids if pk is not None}),
        trace_id=trace_id,
        parent_run_id=request.parent_run_id,
        chain_depth=request.chain_depth,
        concurrency_key=concurrency_key,
        queue=queue_for(snapshot, automation.workspace_id),
        enqueued_at=None if hold else timezone.now(),
    )
    # The automation's definition is its current version's (automation_update stores each one):
    # the run refers to that version instead of keeping a copy.
    run.executes_version(snapshot)
    return run


def _created_event(request: DispatchRequest, automation: Automation, run: Run, inputs: dict[str, Any], *,
                   hold: bool) -> dict[str, Any]:  # fmt: skip
    return dict(
        trace_id=run.trace_id, type="run.created",
        summary=f"{automation.name} v{automation.version}: run created by {request.trigger_type}"
        + (" (queued behind an active run)" if hold else ""),
        workspace_id=automation.workspace_id, actor=request.triggered_by,
        refs={**_actor_refs(request, automation), "run": str(run.pk), "parent_run": str(request.parent_run_id or "")},
        payload={"trigger_type": request.trigger_type, "trigger_key": request.trigger_key,
                 "queue": run.queue, "inputs": inputs, "held": hold},
    )  # fmt: skip


def _created(request: DispatchRequest, automation: Automation, run: Run, *, hold: bool) -> None:
    instruments.fired(trigger_type=request.trigger_type, result="created")
    log_change(run.pk, RunStatus.QUEUED, detail=f"{request.trigger_type} run of {automation.name}"
               + (", held behind an active run" if hold else ""))  # fmt: skip
    if not hold:
        run_enqueue(run)


def purge_dispatch_keys() -> int:
    deleted, _ = DispatchKey.objects.filter(expires_at__lt=timezone.now()).delete()
    return deleted
