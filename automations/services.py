"""Writes: every state change of automations and runs, each audited in its transaction.

Views, admin actions, Celery tasks and management commands all call these.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from approvals.services import approvals_invalidate_for_run
from audit import writer
from audit.models import Outcome
from capabilities.credentials import credential_grants
from config import instruments
from config.errors import InvalidArgument, ServiceError
from workspaces.models import Workspace

from . import definition as defs
from .concurrency import run_settled
from .dispatcher import Dedupe, DispatchError, DispatchRequest, DispatchResult, dispatch, request_hash
from .enqueue import publish_run, run_enqueue
from .models import (
    ACTIVE_RUN_STATUSES,
    Automation,
    AutomationStatus,
    AutomationVersion,
    Run,
    RunStatus,
    StepRun,
    StepStatus,
)
from .steps import REUSED_FROM
from .transitions import check_transition, log_change, skip_unreached

logger = logging.getLogger(__name__)

# Called inside the saving transaction with the automation (e.g. the triggers
# app syncs its Trigger rows); registered in AppConfig.ready so that the
# engine never imports the apps built on top of it.
automation_saved_hooks: list[Callable[[Automation], None]] = []
automation_deleted_hooks: list[Callable[[Automation], None]] = []


class DefinitionInvalid(InvalidArgument):
    def __init__(self, errors: list[dict[str, str]]):
        super().__init__(errors, f"{len(errors)} problem(s) in the definition")


class RunActionRefused(ServiceError):
    """An operator action the run's state does not allow (409 unless said otherwise)."""

    default_status = 409


def _principal(user) -> tuple[int, ...]:
    """The user behind an action, as a run's principal id (none for a system action)."""
    return (user.pk,) if user is not None and user.is_authenticated else ()


def definition_check(definition: Any, workspace: Workspace, automation_id: Any = None) -> None:
    grants = credential_grants(workspace.id)
    errors = defs.validate_definition(
        definition, workspace_id=workspace.id, credential_names=set(grants), credential_grants=grants,
        automation_id=automation_id,
    )  # fmt: skip
    if errors:
        raise DefinitionInvalid(errors)


def _status(value: str | None, current: str) -> str:
    if value is None:
        return current
    if value not in AutomationStatus.values:
        raise DefinitionInvalid(
            [{"path": "/status", "code": "invalid_status", "message": "status is active or paused"}]
        )
    return value


@transaction.atomic
def automation_create(
    *, workspace: Workspace, definition: Any, user=None, status: str | None = None
) -> Automation:
    definition_check(definition, workspace)
    automation = Automation.objects.create(
        workspace=workspace, name=definition["name"], definition=definition, version=1,
        status=_status(status, AutomationStatus.ACTIVE), created_by=user if user and user.is_authenticated else None,
        updated_by=user if user and user.is_authenticated else None,
    )  # fmt: skip
    AutomationVersion.objects.create(automation=automation, version=1, definition=definition,
                                     created_by=automation.created_by)  # fmt: skip
    writer.append(
        trace_id=uuid.uuid4().hex, type="automation.created", summary=f"automation {automation.name} created",
        workspace_id=workspace.id, actor=writer.actor_for(user), refs={"automation": str(automation.pk)},
        payload={"version": 1},
    )  # fmt: skip
    for hook in automation_saved_hooks:
        hook(automation)
    return automation


@transaction.atomic
def automation_update(
    *, automation: Automation, user=None, definition: Any = None, status: str | None = None
) -> Automation:
    automation = Automation.objects.select_for_update(no_key=True).get(pk=automation.pk)
    refuse_archived(automation)
    changes: dict[str, Any] = {}
    if definition is not None and definition != automation.definition:
        definition_check(definition, automation.workspace, automation.pk)
        automation.definition = definition
        automation.name = definition["name"]
        automation.version += 1
        AutomationVersion.objects.create(automation=automation, version=automation.version, definition=definition,
                                         created_by=user if user and user.is_authenticated else None)  # fmt: skip
        changes["version"] = automation.version
    new_status = _status(status, automation.status)
    if new_status == AutomationStatus.ACTIVE and automation.review_required:
        raise RunActionRefused(
            "CONFLICT", "the automation awaits review after an apply raised its risk; an admin activates it"
        )
    if new_status != automation.status:
        changes["status"] = new_status
        automation.status = new_status
    if not changes:
        return automation
    if "version" in changes:
        # ``updated_by`` is the last *definition* editor (four-eyes counts them out of approving its
        # steps): pausing or resuming makes nobody an editor (issue 29).
        automation.updated_by = user if user and user.is_authenticated else automation.updated_by
    automation.save(update_fields=["definition", "name", "version", "status", "updated_by", "updated_at"])
    kind = (
        "automation.updated"
        if "version" in changes
        else f"automation.{'paused' if new_status == 'paused' else 'resumed'}"
    )
    writer.append(
        trace_id=uuid.uuid4().hex, type=kind, summary=f"automation {automation.name}: {changes}",
        workspace_id=automation.workspace_id, actor=writer.actor_for(user), refs={"automation": str(automation.pk)},
        payload=changes,
    )  # fmt: skip
    for hook in automation_saved_hooks:
        hook(automation)
    return automation


@transaction.atomic
def automation_review_activate(*, automation: Automation, user=None) -> Automation:
    """An admin's review of an automation an apply flagged: clear the flag and make it active.

    The caller checks the admin role (API: ``administer`` in the workspace; admin site: the
    same, or a superuser). Activating an automation that awaits no review is refused (409)."""
    automation = Automation.objects.select_for_update(no_key=True).get(pk=automation.pk)
    refuse_archived(automation)
    if not automation.review_required:
        raise RunActionRefused("CONFLICT", "the automation awaits no review")
    reasons = automation.review_reasons
    automation.review_required = False
    automation.review_reasons = []
    automation.status = AutomationStatus.ACTIVE
    automation.save(update_fields=["review_required", "review_reasons", "status", "updated_at"])
    writer.append(
        trace_id=uuid.uuid4().hex, type="automation.review_activated",
        summary=f"automation {automation.name} reviewed and activated",
        workspace_id=automation.workspace_id, actor=writer.actor_for(user), refs={"automation": str(automation.pk)},
        payload={"version": automation.version, "reasons": reasons},
    )  # fmt: skip
    for hook in automation_saved_hooks:
        hook(automation)
    return automation


@transaction.atomic
def automation_version_restore(*, automation: Automation, version: int, user=None) -> Automation:
    """Make an earlier version's definition the current one: a new version, validated and audited."""
    old = AutomationVersion.objects.filter(automation=automation, version=version).first()
    if old is None:
        raise RunActionRefused("NOT_FOUND", f"this automation has no version {version}", 404)
    current = Automation.objects.values_list("definition", flat=True).get(pk=automation.pk)
    if old.definition == current:
        raise RunActionRefused("CONFLICT", f"version {version} is already the current definition")
    saved = automation_update(automation=automation, user=user, definition=old.definition)
    writer.append(
        trace_id=uuid.uuid4().hex, type="automation.version_restored",
        summary=f"automation {saved.name}: version {version} restored as version {saved.version}",
        workspace_id=saved.workspace_id, actor=writer.actor_for(user), refs={"automation": str(saved.pk)},
        payload={"restored": version, "version": saved.version},
    )  # fmt: skip
    return saved


class AutomationArchived(ServiceError):
    """The automation is archived: it can be read, not edited or run."""

    default_status = 409

    def __init__(self, message: str = "the automation is archived") -> None:
        super().__init__("CONFLICT", message, 409)


def refuse_archived(automation: Automation) -> None:
    if automation.archived_at is not None:
        raise AutomationArchived()


def _refuse_active_runs(automation: Automation, what: str) -> None:
    if automation.runs.filter(status__in=ACTIVE_RUN_STATUSES).exists():
        raise RunActionRefused("CONFLICT", f"the automation has active runs; cancel them before {what}")


@transaction.atomic
def automation_archive(*, automation: Automation, user=None) -> Automation:
    """What DELETE does: the automation leaves lists, its triggers stop (beat entries disabled,
    webhooks and events no longer fire) and it cannot run; its runs, steps, versions and
    triggers' history stay. Archiving an archived automation changes nothing."""
    automation = Automation.objects.select_for_update(no_key=True).get(pk=automation.pk)
    if automation.archived_at is not None:
        return automation
    _refuse_active_runs(automation, "archiving it")
    automation.archived_at = timezone.now()
    automation.archived_by = user if user and user.is_authenticated else None
    automation.save(update_fields=["archived_at", "archived_by", "updated_at"])
    writer.append(
        trace_id=uuid.uuid4().hex, type="automation.archived", summary=f"automation {automation.name} archived",
        workspace_id=automation.workspace_id, actor=writer.actor_for(user), refs={"automation": str(automation.pk)},
        payload={"version": automation.version},
    )  # fmt: skip
    for hook in automation_saved_hooks:  # triggers follow: an archived automation's are disabled
        hook(automation)
    return automation


@transaction.atomic
def automation_purge(*, automation: Automation, user=None, actor: str | None = None) -> dict[str, int]:
    """Delete an archived automation with its runs, steps, versions and triggers, for good.

    Admin-only (the caller checks: the admin action asks for a superuser, the
    ``purge_automation`` command for shell access). Refused unless archived and while
    runs are active. The ledger keeps every row it had (audit rows are never deleted)
    and records the purge with what was removed, so it still verifies.
    """
    automation = Automation.objects.select_for_update(no_key=True).get(pk=automation.pk)
    if automation.archived_at is None:
        raise RunActionRefused("CONFLICT", "archive the automation before purging it")
    _refuse_active_runs(automation, "purging it")
    counts = {
        "runs": automation.runs.count(),
        "steps": StepRun.objects.filter(run__automation=automation).count(),
        "versions": automation.versions.count(),
    }
    for hook in automation_deleted_hooks:
        hook(automation)
    writer.append(
        trace_id=uuid.uuid4().hex, type="automation.purged",
        summary=f"automation {automation.name} purged: {counts['runs']} runs, {counts['versions']} versions",
        workspace_id=automation.workspace_id, actor=actor or writer.actor_for(user),
        refs={"automation": str(automation.pk)}, payload={**counts, "name": automation.name},
    )  # fmt: skip
    automation.delete()
    return counts


def run_create(
    *, automation: Automation, inputs: Any, user=None, idempotency_key: str | None = None
) -> DispatchResult:
    """A manual run ("Run now"): the same dispatcher as every trigger."""
    if not isinstance(inputs, dict):
        raise DispatchError("INVALID_ARGUMENT", "inputs must be a JSON object")
    dedupe = None
    if idempotency_key:
        dedupe = Dedupe(
            scope=f"manual:{automation.pk}", key=idempotency_key[:255], request_hash=request_hash(inputs)
        )
    return dispatch(
        DispatchRequest(
            automation_id=automation.pk, inputs=inputs, trigger_type="manual", triggered_by=writer.actor_for(user),
            principal_ids=_principal(user), trigger_payload={}, dedupe=dedupe,
        )
    )  # fmt: skip


@transaction.atomic
def run_cancel(*, run: Run, user=None) -> Run:
    run = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
    if run.status not in ACTIVE_RUN_STATUSES:
        raise RunActionRefused("CONFLICT", f"a {run.status} run cannot be cancelled")
    if run.status == RunStatus.RUNNING:
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        summary = "cancel requested; the worker interrupts the running step (or stops after it, if it cannot be interrupted)"
    else:
        check_transition(run.status, RunStatus.CANCELLED)
        log_change(run.pk, RunStatus.CANCELLED, old=run.status, detail=f"by {writer.actor_for(user)}")
        Run.objects.filter(pk=run.pk).update(
            status=RunStatus.CANCELLED, cancel_requested=True, finished_at=timezone.now(),
            error={"code": "CANCELLED", "message": "cancelled by an operator"},
        )  # fmt: skip
        for status, why in ((StepStatus.AWAITING_APPROVAL, "a decision"), (StepStatus.WAITING, "its timer")):
            StepRun.objects.filter(run=run, status=status).update(
                status=StepStatus.CANCELLED, error_code="CANCELLED", finished_at=timezone.now(),
                error_message=f"cancelled while waiting for {why}",
            )  # fmt: skip
        skip_unreached(run, RunStatus.CANCELLED)
        summary = "run cancelled"
        instruments.run_finished(status=RunStatus.CANCELLED, queue=run.queue, created_at=run.created_at,
                                 finished_at=timezone.now())  # fmt: skip
        approvals_invalidate_for_run(
            run_id=run.pk, actor=writer.actor_for(user), reason="the run was cancelled"
        )
    writer.append(
        trace_id=run.trace_id, type="operator.run.cancelled", summary=summary, workspace_id=run.workspace_id,
        actor=writer.actor_for(user), refs={"run": str(run.pk)},
    )  # fmt: skip
    if run.status != RunStatus.RUNNING:
        transaction.on_commit(lambda: run_settled(run))
    run.refresh_from_db()
    return run


@transaction.atomic
def run_rerun(*, run: Run, user=None, from_step: str | None = None) -> Run:
    """A new run of the same snapshot and inputs; from ``from_step`` reuses earlier outputs."""
    refuse_archived(run.automation)
    plan = run.snapshot["plan"]
    start = 0
    context: dict[str, Any] = {}
    if from_step is not None:
        ids = [step["step_id"] for step in plan]
        if from_step not in ids:
            raise RunActionRefused("INVALID_ARGUMENT", f"no step '{from_step}' in this run's plan", 400)
        start = ids.index(from_step)
        earlier = {s.index: s for s in run.steps.filter(phase="plan", index__lt=start)}
        for index in range(start):
            step_run = earlier.get(index)
            if step_run is None or step_run.status not in (StepStatus.SUCCEEDED, StepStatus.SKIPPED):
                raise RunActionRefused(
                    "INVALID_ARGUMENT", f"step '{ids[index]}' did not succeed in the original run", 400
                )
            if plan[index].get("output_as") and step_run.output:
                context[plan[index]["output_as"]] = step_run.output.get("data")
    # The re-run walks past the reused steps from the first one, so a step among them that would be
    # gated now (require_approval, or its risk at the autonomy of the time) asks a human again.
    first_reused = min(
        (s.index for s in run.steps.filter(phase="plan", index__lt=start, status=StepStatus.SUCCEEDED)),
        default=start,
    )
    new = Run.objects.create(
        workspace_id=run.workspace_id, automation_id=run.automation_id, automation_version=run.automation_version,
        snapshot_copy=run.snapshot_copy, inputs=run.inputs, trigger_type=run.trigger_type, trigger_key=run.trigger_key,
        trigger_id=run.trigger_id, trigger_payload=run.trigger_payload, triggered_by=writer.actor_for(user),
        principal_ids=sorted({*run.principal_ids, *_principal(user)}), trace_id=uuid.uuid4().hex, parent_run=run,
        # Not an event hop: a re-run sits at the depth of the run it repeats, so its events count
        # toward MAX_CHAIN_DEPTH as the original's did (depth 0 would let a loop start over).
        chain_depth=run.chain_depth, queue=run.queue, concurrency_key=run.concurrency_key,
        step_index=first_reused, context=context, enqueued_at=timezone.now(),
    )  # fmt: skip
    for step_run in run.steps.filter(phase="plan", index__lt=start):
        StepRun.objects.create(
            run=new, phase="plan", index=step_run.index, step_id=step_run.step_id, action=step_run.action,
            status=step_run.status, attempt=step_run.attempt, rendered_config=step_run.rendered_config,
            output=step_run.output, started_at=step_run.started_at, finished_at=step_run.finished_at,
            checkpoint={REUSED_FROM: str(run.pk)},
        )  # fmt: skip
    for trace in {run.trace_id, new.trace_id}:
        writer.append(
            trace_id=trace, type="operator.run.rerun",
            summary=f"run {new.pk} re-runs {run.pk}" + (f" from step {from_step}" if from_step else ""),
            workspace_id=run.workspace_id, actor=writer.actor_for(user), refs={"run": str(new.pk), "parent_run": str(run.pk)},
        )  # fmt: skip
    log_change(new.pk, RunStatus.QUEUED, detail=f"re-run of {run.pk} by {writer.actor_for(user)}")
    run_enqueue(new)
    return new


RESOLUTIONS = ("succeeded", "retry", "failed")


@transaction.atomic
def run_resolve(*, run: Run, resolution: str, user=None, reason: str = "", output: Any = None) -> Run:
    """An operator settles a ``needs_attention`` run: the step did succeed, should be retried, or failed."""
    if resolution not in RESOLUTIONS:
        raise RunActionRefused("INVALID_ARGUMENT", "resolution must be succeeded, retry or failed", 400)
    run = Run.objects.select_for_update(no_key=True).get(pk=run.pk)
    if run.status != RunStatus.NEEDS_ATTENTION:
        raise RunActionRefused(
            "CONFLICT", f"only needs_attention runs can be resolved (this one is {run.status})"
        )
    step_run = StepRun.objects.filter(run=run, phase=run.phase, index=run.step_index).first()
    now = timezone.now()
    fields: dict[str, Any] = {"error": None, "claimed_by": "", "lease_expires_at": None}
    if resolution == "succeeded":
        if step_run is not None:
            StepRun.objects.filter(pk=step_run.pk).update(
                status=StepStatus.SUCCEEDED, error_code="", error_message="", finished_at=now,
                output={"ok": True, "summary": "marked succeeded by an operator", "data": output, "error": None},
            )  # fmt: skip
            step = (run.snapshot["plan"] if run.phase == "plan" else run.snapshot["execution"]["on_failure"])[
                run.step_index
            ]
            if step.get("output_as"):
                fields["context"] = {**run.context, step["output_as"]: output}
        fields.update(status=RunStatus.QUEUED, step_index=run.step_index + 1, enqueued_at=now, recoveries=0)
    elif resolution == "retry":
        if step_run is not None:
            StepRun.objects.filter(pk=step_run.pk).update(
                status=StepStatus.PENDING, error_code="", error_message=""
            )
        # The operator vouches for running it again: AUTOPLANE_MAX_RECOVERIES counts afresh.
        fields.update(status=RunStatus.QUEUED, enqueued_at=now, recoveries=0)
    else:
        fields.update(status=RunStatus.FAILED, finished_at=now,
                      error={"code": "OUTCOME_UNKNOWN", "message": "marked failed by an operator"})  # fmt: skip
    check_transition(run.status, fields["status"])
    Run.objects.filter(pk=run.pk).update(**fields)
    if fields["status"] == RunStatus.FAILED:  # its history shows every plan step, as a failed run's does
        skip_unreached(run, RunStatus.FAILED)
    log_change(run.pk, fields["status"], old=run.status,
               detail=f"resolved '{resolution}' by {writer.actor_for(user)}")  # fmt: skip
    writer.append(
        trace_id=run.trace_id, type="operator.run.resolved", summary=f"operator resolved the run: {resolution}",
        workspace_id=run.workspace_id, actor=writer.actor_for(user), refs={"run": str(run.pk)},
        payload={"resolution": resolution, "reason": reason[:1000]},
        outcome=Outcome.SUCCESS if resolution != "failed" else Outcome.FAILURE,
    )  # fmt: skip
    run.refresh_from_db()
    if run.status == RunStatus.QUEUED:
        run_enqueue(run)
    else:
        instruments.run_finished(status=run.status, queue=run.queue, created_at=run.created_at,
                                 finished_at=run.finished_at)  # fmt: skip
        transaction.on_commit(lambda: run_settled(run))
    return run


@transaction.atomic
def run_resume(*, run_id: str, reason: str = "approval decided") -> bool:
    """An awaiting run may continue (its approval was decided): queue it again."""
    updated = Run.objects.filter(pk=run_id, status=RunStatus.AWAITING_APPROVAL).update(
        status=RunStatus.QUEUED, enqueued_at=timezone.now()
    )
    if updated:
        run = Run.objects.get(pk=run_id)
        log_change(run.pk, RunStatus.QUEUED, old=RunStatus.AWAITING_APPROVAL, detail=reason)
        writer.append(trace_id=run.trace_id, type="run.resumed", summary=f"run resumed: {reason}",
                      workspace_id=run.workspace_id, refs={"run": str(run.pk)})  # fmt: skip
        run_enqueue(run)
    return bool(updated)


def runs_sweep() -> dict[str, int]:
    """Find runs whose message or worker was lost and queue them again (beat, every few seconds).

    The database is the source of truth: a flushed broker or a killed worker
    loses messages, never runs. Re-enqueueing is harmless because execution
    starts with a claim.
    """
    now = timezone.now()
    requeue_after = timedelta(seconds=settings.AUTOPLANE_REQUEUE_AFTER_SECONDS)
    counts = {"lease_expired": 0, "due": 0, "lost_messages": 0}
    # A run whose lease ran out is sent once per expiry: the send releases it (no
    # claimant, the lease stamped with the send), so the next passes leave it alone
    # unless that message too went untaken for REQUEUE_AFTER.
    lease_expired = Run.objects.filter(status=RunStatus.RUNNING, lease_expires_at__lt=now).filter(
        ~Q(claimed_by="") | Q(lease_expires_at__lt=now - requeue_after)
    )
    # A waiting run whose timer fired, likewise: sent once (``resent_at``, not ``enqueued_at``, which
    # times the queue wait), and again only if that message went untaken for REQUEUE_AFTER. A marker
    # older than the timer is from an earlier wait.
    due = Run.objects.filter(status=RunStatus.WAITING, wake_at__lte=now - timedelta(seconds=2)).filter(
        Q(resent_at__isnull=True) | Q(resent_at__lt=F("wake_at")) | Q(resent_at__lt=now - requeue_after)
    )
    stale = Run.objects.filter(status=RunStatus.QUEUED, enqueued_at__lt=now - requeue_after)
    for name, queryset in (("lease_expired", lease_expired), ("due", due), ("lost_messages", stale)):
        for run_id, queue in queryset.values_list("pk", "queue")[:500]:
            if name == "lost_messages":
                # Bump the stamp so the next sweep does not queue it yet again.
                Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(enqueued_at=now)
            elif name == "lease_expired" and not lease_expired.filter(pk=run_id).update(
                claimed_by="", lease_expires_at=now
            ):
                continue  # claimed meanwhile, or another sweep sent it
            elif name == "due" and not due.filter(pk=run_id).update(resent_at=now):
                continue  # claimed meanwhile, or another sweep sent it
            publish_run(str(run_id), queue, careful=True)  # it may have killed the worker it was with
            counts[name] += 1
    return counts
