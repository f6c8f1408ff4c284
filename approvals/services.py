"""Writes for approvals: decide (API, admin and one-click link all call ``approval_decide``),
expire, standing approvals, one-click links. Each change is audited in its transaction.

A decided approval resumes its run by enqueueing the engine's
``autoplane.resume_run`` task *by name* after commit: approvals never import
the engine. The executor then verifies and consumes the token (or records the
denial or expiry) through ``approvals.gate.check_step``.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core import signing as django_signing
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from audit import writer
from audit.models import Outcome
from capabilities import json_schema
from config import instruments
from config.celery import app
from config.errors import ServiceError
from workspaces.access import has_permission
from workspaces.models import Permission, Workspace

from . import tokens
from .gate import standing_bounds, standing_signature_problem
from .models import (
    LIVE_STATUSES,
    Approval,
    ApprovalDecision,
    ApprovalStatus,
    ConsumedNonce,
    Decision,
    StandingApproval,
)

RESUME_TASK = "autoplane.resume_run"
# A token minted just before its approval expires still leaves the run this long to resume.
TOKEN_MIN_TTL = timedelta(minutes=10)
# The expiry sweep re-sends resume_run for decisions the executor has not acted on
# (a lost message, or a decision made before the run finished parking) ...
NUDGE_AFTER = timedelta(seconds=30)
# ... for this long after the decision; run_resume is a no-op for a run that moved on.
NUDGE_FOR = timedelta(hours=1)
MAX_STANDING_USES = 10_000
MAX_STANDING_LIFETIME = timedelta(days=365)
LINK_SALT = "autoplane.approvals.link.v1"
LINK_TTL = timedelta(hours=24)
SWEEP_BATCH = 500


class ApprovalError(ServiceError):
    """A refused approval operation, with a stable API code and HTTP status."""


def _refs(approval: Approval) -> dict[str, str]:
    return {
        "approval": str(approval.pk),
        "run": str(approval.run_id),
        "step": approval.step_id,
        "automation": str(approval.automation_id),
    }


# The engine registers, in its AppConfig.ready, how to publish a domain event: approval.decided,
# approval.expired, approval.reminded and approval.escalated (notifications publishes those two through
# approval_event_publish) are usable as event triggers, and approvals never import the engine.
_decision_listener: list[Callable[..., Any]] = []


def register_decision_listener(listener: Callable[..., Any]) -> None:
    _decision_listener[:] = [listener]


def approval_event_publish(approval: Approval, event_type: str, **payload: Any) -> None:
    if _decision_listener:
        _decision_listener[0](
            workspace_id=approval.workspace_id, event_type=event_type, source="approvals",
            payload={"approval_id": str(approval.pk), "run_id": str(approval.run_id),
                     "automation_id": str(approval.automation_id), "automation_name": approval.automation_name,
                     "step_id": approval.step_id, "risk": approval.risk, **payload},
            trace_id=approval.trace_id,
        )  # fmt: skip


def _resume_on_commit(run_id: Any, reason: str) -> None:
    run, why = str(run_id), reason
    transaction.on_commit(lambda: app.send_task(RESUME_TASK, args=[run, why], ignore_result=True))


# --- edit-then-approve ----------------------------------------------------------------


@dataclass(frozen=True)
class EditedPlan:
    """What an approver's edited config would run as, checked and gated again by the engine."""

    config: dict[str, Any]
    plan_hash: str
    risk: str
    reasons: list[str]
    message: str
    why: str
    approvals_required: int


# The engine registers, in its AppConfig.ready, how to check an edited config against the step it
# replaces (automations/approval_edits.py): a 400 ServiceError when it may not run, else its plan.
EditCheck = Callable[[Approval, Any], EditedPlan]
_edit_check: list[EditCheck] = []


def register_edit_check(check: EditCheck) -> None:
    _edit_check[:] = [check]


def config_diff(before: Any, after: Any, path: str = "") -> list[dict[str, Any]]:
    """JSON-pointer changes from ``before`` to ``after``: ``{"path", "before"?, "after"?}`` each."""
    if isinstance(before, dict) and isinstance(after, dict):
        changes: list[dict[str, Any]] = []
        for key in sorted(set(before) | set(after), key=str):
            where = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if key not in after:
                changes.append({"path": where, "before": before[key]})
            elif key not in before:
                changes.append({"path": where, "after": after[key]})
            else:
                changes += config_diff(before[key], after[key], where)
        return changes
    if _same(before, after) or (type(before) is type(after) and before == after):
        return []
    return [{"path": path or "/", "before": before, "after": after}]


def _apply_edit(approval: Approval, user, edited_config: Any, via: str) -> None:
    """Rebind the pending ``approval`` to the edited config (raises a 400 before writing anything).

    Quorum: the edit counts as the editor's approval (recorded next by the caller); approvals given
    before the edit were for another config and are dropped, so a quorum above one needs others to
    approve the edited config. It never falls: the larger of the old and the edit's own quorum;
    under four-eyes at least two, since whoever wrote what runs may not be its only approver."""
    if not _edit_check:
        raise ApprovalError("INVALID_ARGUMENT", "edit-then-approve is not available here")
    plan = _edit_check[0](approval, edited_config)
    if plan.plan_hash == approval.plan_hash:
        return  # nothing changed: a plain approval
    four_eyes = Workspace.objects.filter(pk=approval.workspace_id, four_eyes=True).exists()
    required = max(approval.approvals_required, plan.approvals_required, 2 if four_eyes else 1)
    earlier = list(
        approval.decisions.filter(decision=Decision.APPROVE).values_list("user__username", flat=True)
    )
    approval.decisions.all().delete()
    before = {"what": approval.what, "risk": approval.risk, "plan_hash": approval.plan_hash,
              "approvals_required": approval.approvals_required}  # fmt: skip
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        edited_config=plan.config, edited_by=user.get_username(), what=plan.config, plan_hash=plan.plan_hash,
        risk=plan.risk, reasons=plan.reasons, message=plan.message[:10_000], why=plan.why,
        approvals_required=required,
    )  # fmt: skip
    if not updated:
        raise ApprovalError("CONFLICT", "this approval was decided by someone else just now", 409)
    writer.append(
        trace_id=approval.trace_id, type="approval.edited", stage="approval",
        summary=f"{approval.step_id}: config edited by {user.get_username()} before approving "
        f"(risk {before['risk']} -> {plan.risk}; {required} approver(s))",
        workspace_id=approval.workspace_id, actor=writer.actor_for(user), refs=_refs(approval),
        payload={"via": via, "diff": config_diff(before["what"], plan.config), "before": before,
                 "after": {"what": plan.config, "risk": plan.risk, "plan_hash": plan.plan_hash,
                           "approvals_required": required},
                 "superseded_approvals": earlier},
    )  # fmt: skip
    approval.refresh_from_db()


# --- deciding --------------------------------------------------------------------


def _own_work(approval: Approval, user) -> str | None:
    """Why four-eyes forbids ``user`` from approving this, or None."""
    if approval.requested_by == f"user:{user.get_username()}" or user.pk in (approval.principal_ids or ()):
        return "you are behind this run (you started it, published its event or fired its webhook)"
    if approval.last_editor_id is not None and approval.last_editor_id == user.pk:
        return "you last edited this automation"
    return None


def approval_decide_refusal(*, approval: Approval, user, now: datetime | None = None) -> ApprovalError | None:
    """Why ``user`` may not decide on ``approval`` now (besides their role), or None.

    ``approval_decide`` raises it; the admin uses it to offer Approve / Deny only
    to those who may still decide.
    """
    if approval.status != ApprovalStatus.PENDING:
        return ApprovalError("CONFLICT", f"this approval is already {approval.status}", 409)
    if approval.expires_at <= (now or timezone.now()):
        return ApprovalError("CONFLICT", "this approval has expired", 409)
    if Workspace.objects.filter(pk=approval.workspace_id, four_eyes=True).exists():
        own = _own_work(approval, user)
        if own is not None:
            return ApprovalError("PERMISSION_DENIED", f"four-eyes: {own}, so someone else must decide", 403)
    if approval.decisions.filter(user=user).exists():
        return ApprovalError("CONFLICT", "you have already decided on this approval", 409)
    return None


@transaction.atomic
def approval_decide(
    *, approval_id: Any, user, decision: str, reason: str = "", via: str = "api", edited_config: Any = None
) -> Approval:
    """Record ``user``'s approve/deny. Exactly one outcome wins under concurrency: the row is
    locked (``select_for_update``; SQLite serialises writers) and every status change is a
    conditional UPDATE on ``status='pending'``.

    ``edited_config`` (approve only): edit, then approve — see :func:`_apply_edit`."""
    if decision not in (Decision.APPROVE, Decision.DENY):
        raise ApprovalError("INVALID_ARGUMENT", "decision must be approve or deny")
    if edited_config is not None and decision != Decision.APPROVE:
        raise ApprovalError("INVALID_ARGUMENT", "edited_config goes with approve only")
    reason = (reason or "").strip()
    approval = Approval.objects.select_for_update().filter(pk=approval_id).first()
    if approval is None:
        raise ApprovalError("NOT_FOUND", "approval not found", 404)
    if not has_permission(user, approval.workspace_id, Permission.APPROVE):
        raise ApprovalError("PERMISSION_DENIED", "your role in this workspace does not allow approving", 403)
    if decision == Decision.DENY and not reason:
        raise ApprovalError("INVALID_ARGUMENT", "a reason is required to deny")
    if decision == Decision.APPROVE and approval.action == QUESTION_ACTION:
        raise ApprovalError("INVALID_ARGUMENT", 'this is a question: answer it ("decision": "answer")')
    now = timezone.now()
    refusal = approval_decide_refusal(approval=approval, user=user, now=now)
    if refusal is not None:
        raise refusal
    if edited_config is not None:
        _apply_edit(approval, user, edited_config, via)
    try:
        with transaction.atomic():
            ApprovalDecision.objects.create(approval=approval, user=user, decision=decision, reason=reason[:2000],
                                            via=via)  # fmt: skip
    except IntegrityError:
        raise ApprovalError("CONFLICT", "you have already decided on this approval", 409)

    actor = writer.actor_for(user)
    if decision == Decision.DENY:
        _transition(approval, status=ApprovalStatus.DENIED, decided_at=now)
        writer.append(
            trace_id=approval.trace_id, type="approval.denied", outcome=Outcome.FAILURE, stage="approval",
            summary=f"{approval.step_id}: denied by {user.get_username()}: {reason[:200]}",
            workspace_id=approval.workspace_id, actor=actor, refs=_refs(approval),
            payload={"via": via, "reason": reason[:1000]},
        )  # fmt: skip
        approval_event_publish(
            approval, "approval.decided", decision="denied", decided_by=[user.get_username()]
        )
        _resume_on_commit(approval.run_id, "approval denied")
    else:
        approvals = approval.decisions.filter(decision=Decision.APPROVE).count()
        if approvals >= approval.approvals_required:
            token = tokens.mint(
                approval_id=str(approval.pk), run_id=str(approval.run_id), step_key=approval.step_key,
                plan_hash=approval.plan_hash, nonce=secrets.token_urlsafe(24),
                exp=max(approval.expires_at, now + TOKEN_MIN_TTL),
            )  # fmt: skip
            _transition(approval, status=ApprovalStatus.APPROVED, decided_at=now, token=token)
            writer.append(
                trace_id=approval.trace_id, type="approval.approved", outcome=Outcome.SUCCESS, stage="approval",
                summary=f"{approval.step_id}: approved ({approvals} of {approval.approvals_required})",
                workspace_id=approval.workspace_id, actor=actor, refs=_refs(approval),
                payload={"via": via, "reason": reason[:1000], "approvals": approvals,
                         "approvers": list(approval.decisions.values_list("user__username", flat=True)),
                         "plan_hash": approval.plan_hash, "key_id": tokens.decode(token)[1]["kid"]},
                secrets=[token],
            )  # fmt: skip
            approval_event_publish(approval, "approval.decided", decision="approved",
                      decided_by=list(approval.decisions.values_list("user__username", flat=True)))  # fmt: skip
            _resume_on_commit(approval.run_id, "approval granted")
        else:
            writer.append(
                trace_id=approval.trace_id, type="approval.decision_recorded", stage="approval",
                summary=f"{approval.step_id}: approved by {user.get_username()} "
                f"({approvals} of {approval.approvals_required})",
                workspace_id=approval.workspace_id, actor=actor, refs=_refs(approval),
                payload={"via": via, "reason": reason[:1000], "approvals": approvals,
                         "approvals_required": approval.approvals_required},
            )  # fmt: skip
    approval.refresh_from_db()
    return approval


# --- ask_human: answering a question -------------------------------------------------------

QUESTION_ACTION = "ask_human"


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b  # True is not 1


def _check_answer(question: Any, value: Any, freetext: Any) -> None:
    """400 INVALID_ARGUMENT unless (value, freetext) is an answer the question allows."""
    question = question if isinstance(question, dict) else {}
    options = [o.get("value") for o in question.get("options") or () if isinstance(o, dict)]
    schema = question.get("input_schema")
    if freetext not in (None, "") and not isinstance(freetext, str):
        raise ApprovalError("INVALID_ARGUMENT", "freetext must be a string")
    if freetext and not question.get("allow_freetext"):
        raise ApprovalError("INVALID_ARGUMENT", "this question does not take free text")
    if freetext and len(freetext) > 10_000:
        raise ApprovalError("INVALID_ARGUMENT", "freetext is at most 10000 characters")
    if value is None:
        if not freetext:
            raise ApprovalError("INVALID_ARGUMENT", "give a value (one of the options) or free text")
        if options or schema is not None:
            raise ApprovalError("INVALID_ARGUMENT", "give a value: one of the options offered")
        return
    if options and not any(_same(value, option) for option in options):
        raise ApprovalError("INVALID_ARGUMENT", "that value is not one of the options offered")
    if isinstance(schema, dict):
        # RE2 for the schema's patterns, as for every schema a user writes (capabilities/json_schema.py).
        error = None
        if json_schema.schema_problem(schema) is None:
            error = next(iter(json_schema.validator(schema).iter_errors(value)), None)
        if error is not None:
            raise ApprovalError(
                "INVALID_ARGUMENT", f"the value does not match the input schema: {error.message[:200]}"
            )
    elif not options:
        raise ApprovalError("INVALID_ARGUMENT", "this question takes free text only")


def _answer(approval: Approval, *, answer: dict[str, Any], now: datetime, actor: str, type: str,
            summary: str, via: str) -> None:  # fmt: skip
    token = tokens.mint(
        approval_id=str(approval.pk), run_id=str(approval.run_id), step_key=approval.step_key,
        plan_hash=approval.plan_hash, nonce=secrets.token_urlsafe(24), exp=max(approval.expires_at, now + TOKEN_MIN_TTL),
    )  # fmt: skip
    _transition(approval, status=ApprovalStatus.APPROVED, decided_at=now, token=token, answer=answer)
    writer.append(
        trace_id=approval.trace_id, type=type, outcome=Outcome.SUCCESS, stage="approval", summary=summary[:500],
        workspace_id=approval.workspace_id, actor=actor, refs=_refs(approval),
        payload={"via": via, **answer, "plan_hash": approval.plan_hash}, secrets=[token],
    )  # fmt: skip
    approval_event_publish(approval, "approval.decided", decision="answered", value=answer["value"],
              decided_by=[answer["decided_by"]] if answer["decided_by"] else [], timed_out=answer["timed_out"])  # fmt: skip
    _resume_on_commit(approval.run_id, "question answered")


@transaction.atomic
def approval_answer(
    *, approval_id: Any, user, value: Any = None, freetext: Any = "", via: str = "api"
) -> Approval:
    """Answer an ``ask_human`` question: one answer decides it (roles and four-eyes as for approving).
    A value not offered, free text the question does not take, or a value failing its input schema
    is a 400 and records nothing."""
    approval = Approval.objects.select_for_update().filter(pk=approval_id).first()
    if approval is None:
        raise ApprovalError("NOT_FOUND", "approval not found", 404)
    if not has_permission(user, approval.workspace_id, Permission.APPROVE):
        raise ApprovalError("PERMISSION_DENIED", "your role in this workspace does not allow approving", 403)
    if approval.action != QUESTION_ACTION:
        raise ApprovalError("INVALID_ARGUMENT", "this approval is not a question: approve or deny it")
    now = timezone.now()
    refusal = approval_decide_refusal(approval=approval, user=user, now=now)
    if refusal is not None:
        raise refusal
    _check_answer(approval.what, value, freetext)
    freetext = freetext or ""
    try:
        with transaction.atomic():
            ApprovalDecision.objects.create(approval=approval, user=user, decision=Decision.ANSWER,
                                            reason=freetext[:2000], via=via)  # fmt: skip
    except IntegrityError:
        raise ApprovalError("CONFLICT", "you have already decided on this approval", 409)
    answer = {"value": value, "freetext": freetext, "decided_by": user.get_username(), "timed_out": False}
    _answer(approval, answer=answer, now=now, actor=writer.actor_for(user), type="approval.answered",
            summary=f"{approval.step_id}: answered {value!r} by {user.get_username()}", via=via)  # fmt: skip
    approval.refresh_from_db()
    return approval


def _transition(approval: Approval, **fields: Any) -> None:
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(**fields)
    if not updated:
        raise ApprovalError("CONFLICT", "this approval was decided by someone else just now", 409)
    instruments.approval_event(str(fields["status"]))


# --- expiry sweep ------------------------------------------------------------------


def approvals_expire(*, now: datetime | None = None) -> dict[str, int]:
    """Expire pending approvals past their time and resume their runs (beat, every 30 s).

    Also re-sends ``resume_run`` for decisions the executor has not acted on yet.
    """
    now = now or timezone.now()
    expired = 0
    due = Approval.objects.filter(status=ApprovalStatus.PENDING, expires_at__lte=now)
    for pk in list(due.values_list("pk", flat=True)[:SWEEP_BATCH]):
        with transaction.atomic():
            approval = (
                Approval.objects.select_for_update().filter(pk=pk, status=ApprovalStatus.PENDING).first()
            )
            if approval is None or approval.expires_at > now:
                continue
            question = approval.what if isinstance(approval.what, dict) else {}
            if approval.action == QUESTION_ACTION and "on_timeout" in question:
                answer = {
                    "value": question["on_timeout"],
                    "freetext": "",
                    "decided_by": None,
                    "timed_out": True,
                }
                _answer(approval, answer=answer, now=now, actor="system", type="approval.answer_timed_out",
                        summary=f"{approval.step_id}: nobody answered in time; took {question['on_timeout']!r}",
                        via="timeout")  # fmt: skip
                expired += 1
                continue
            _transition(approval, status=ApprovalStatus.EXPIRED, decided_at=now)
            writer.append(
                trace_id=approval.trace_id, type="approval.expired", outcome=Outcome.FAILURE, stage="approval",
                summary=f"{approval.step_id}: the approval expired undecided", workspace_id=approval.workspace_id,
                refs=_refs(approval), payload={"expires_at": approval.expires_at.isoformat()},
            )  # fmt: skip
            approval_event_publish(approval, "approval.expired", expires_at=approval.expires_at.isoformat())
            _resume_on_commit(approval.run_id, "approval expired")
            expired += 1
    unsettled = Approval.objects.filter(
        status__in=[ApprovalStatus.APPROVED, ApprovalStatus.DENIED, ApprovalStatus.EXPIRED],
        settled_at__isnull=True,
        decided_at__lte=now - NUDGE_AFTER,
        decided_at__gte=now - NUDGE_FOR,
    )
    nudged = 0
    for run_id in set(unsettled.values_list("run_id", flat=True)[:SWEEP_BATCH]):
        _resume_on_commit(run_id, "approval decided (resent)")
        nudged += 1
    return {"expired": expired, "nudged": nudged}


# --- standing approvals --------------------------------------------------------------


def _check_constraint(arg_constraint: Any) -> None:
    if arg_constraint is None:
        return
    if not isinstance(arg_constraint, dict):
        raise ApprovalError("INVALID_ARGUMENT", "arg_constraint must be a JSON Schema object or null")
    problem = json_schema.schema_problem(arg_constraint)
    if problem is not None:
        raise ApprovalError(
            "INVALID_ARGUMENT",
            f"arg_constraint is not a valid JSON Schema at {problem[0] or '/'}: {problem[1][:200]}",
        )


# The automations app registers, in its AppConfig.ready, how to find an automation's workspace,
# last definition editor and current version by id: approvals never import the engine (STYLE:
# dependencies point one way).
AutomationLookup = Callable[[uuid.UUID], "tuple[int, int | None, int] | None"]
_automation_lookup: list[AutomationLookup] = []


def register_automation_lookup(lookup: AutomationLookup) -> None:
    _automation_lookup[:] = [lookup]


def _automation_in(workspace: Workspace, automation_id: uuid.UUID) -> tuple[int | None, int]:
    """The automation's (last definition editor id, current version); NOT_FOUND unless it exists in
    ``workspace``."""
    found = _automation_lookup[0](automation_id) if _automation_lookup else None
    if found is None or found[0] != workspace.id:
        raise ApprovalError("NOT_FOUND", "automation not found", 404)
    return found[1], found[2]


def standing_approval_state(standing: StandingApproval, now: datetime | None = None) -> dict[str, Any]:
    """Whether a standing approval can still pre-authorise anything, in words an operator reads.

    ``void_since_version``: the automation was edited after the grant, so it covers no run of the
    new version (runs of the version it was granted for still count). ``state`` is ``active``,
    ``revoked``, ``expired``, ``used up``, ``void since version N``, ``void: signed by a retired
    key``, ``void: its signature does not match its bounds`` or ``void: not bound to a version``.
    """
    now = now or timezone.now()
    found = _automation_lookup[0](standing.automation_id) if _automation_lookup else None
    current = found[2] if found else None
    void_since = None
    if (
        standing.automation_version is not None
        and current is not None
        and current != standing.automation_version
    ):
        void_since = standing.automation_version + 1
    problem = standing_signature_problem(standing)
    if standing.revoked:
        state = "revoked"
    elif standing.automation_version is None:
        state = "void: not bound to a version (granted before version binding)"
    elif problem == "retired_key":
        state = "void: signed by a retired key"
    elif problem is not None:
        state = "void: its signature does not match its bounds"
    elif void_since is not None:
        state = f"void since version {void_since}"
    elif standing.expires_at <= now:
        state = "expired"
    elif standing.uses >= standing.max_uses:
        state = "used up"
    else:
        state = "active"
    return {"state": state, "void_since_version": void_since, "current_version": current}


def standing_approval_validate(
    *, automation_id: Any, capability_id: str, max_uses: Any, expires_at: datetime, arg_constraint: Any
) -> uuid.UUID:
    """Check a standing approval's bounds (ApprovalError if unusable); returns the automation id as a UUID."""
    try:
        automation_uuid = uuid.UUID(str(automation_id))
    except ValueError:
        raise ApprovalError("INVALID_ARGUMENT", "automation_id must be a UUID")
    if not capability_id or len(capability_id) > 200:
        raise ApprovalError("INVALID_ARGUMENT", "capability_id is required")
    if not isinstance(max_uses, int) or isinstance(max_uses, bool) or not 1 <= max_uses <= MAX_STANDING_USES:
        raise ApprovalError("INVALID_ARGUMENT", f"max_uses must be between 1 and {MAX_STANDING_USES}")
    now = timezone.now()
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        raise ApprovalError("INVALID_ARGUMENT", "expires_at must be a date and time with a timezone")
    if not now < expires_at <= now + MAX_STANDING_LIFETIME:
        raise ApprovalError("INVALID_ARGUMENT", "expires_at must be in the future and within a year")
    _check_constraint(arg_constraint)
    return automation_uuid


@transaction.atomic
def standing_approval_create(
    *,
    workspace: Workspace,
    automation_id: Any,
    capability_id: str,
    max_uses: int,
    expires_at: datetime,
    user,
    arg_constraint: Any = None,
    reason: str = "",
) -> StandingApproval:
    """Pre-authorise ``capability_id`` for one automation, signed over its bounds."""
    if not has_permission(user, workspace.id, Permission.APPROVE):
        raise ApprovalError("PERMISSION_DENIED", "your role in this workspace does not allow approving", 403)
    automation_id = standing_approval_validate(
        automation_id=automation_id, capability_id=capability_id, max_uses=max_uses, expires_at=expires_at,
        arg_constraint=arg_constraint,
    )  # fmt: skip
    last_editor_id, version = _automation_in(workspace, automation_id)
    if workspace.four_eyes and last_editor_id is not None and last_editor_id == user.pk:
        raise ApprovalError("PERMISSION_DENIED", "four-eyes: you last edited this automation, so someone else "
                            "must create its standing approval", 403)  # fmt: skip
    standing = StandingApproval(
        workspace=workspace,
        automation_id=automation_id,
        capability_id=capability_id,
        max_uses=max_uses,
        # Whole seconds: the signature covers the expiry at that precision.
        expires_at=expires_at.replace(microsecond=0),
        arg_constraint=arg_constraint,
        reason=(reason or "")[:2000],
        created_by=user,
        # Bound (and signed) to the version it was granted for: an edit is never pre-approved.
        automation_version=version,
    )
    standing.key_id, standing.signature = tokens.standing_sign(**standing_bounds(standing))
    standing.save(force_insert=True)
    writer.append(
        trace_id=uuid.uuid4().hex, type="approval.standing.created", stage="approval",
        summary=f"standing approval for {capability_id} on automation {automation_id}: {max_uses} use(s)",
        workspace_id=workspace.id, actor=writer.actor_for(user),
        refs={"standing_approval": str(standing.pk), "automation": str(automation_id)},
        payload={"capability": capability_id, "max_uses": max_uses, "expires_at": standing.expires_at.isoformat(),
                 "arg_constraint": arg_constraint, "key_id": standing.key_id, "automation_version": version},
    )  # fmt: skip
    return standing


@transaction.atomic
def standing_approval_revoke(*, standing_id: Any, user) -> StandingApproval:
    standing = StandingApproval.objects.select_for_update().filter(pk=standing_id).first()
    if standing is None:
        raise ApprovalError("NOT_FOUND", "standing approval not found", 404)
    if not has_permission(user, standing.workspace_id, Permission.APPROVE):
        raise ApprovalError("PERMISSION_DENIED", "your role in this workspace does not allow approving", 403)
    now = timezone.now()
    if not StandingApproval.objects.filter(pk=standing.pk, revoked=False).update(
        revoked=True, revoked_at=now
    ):
        raise ApprovalError("CONFLICT", "this standing approval is already revoked", 409)
    writer.append(
        trace_id=uuid.uuid4().hex, type="approval.standing.revoked", stage="approval",
        summary=f"standing approval for {standing.capability_id} revoked after {standing.uses} use(s)",
        workspace_id=standing.workspace_id, actor=writer.actor_for(user),
        refs={"standing_approval": str(standing.pk), "automation": str(standing.automation_id)},
    )  # fmt: skip
    standing.refresh_from_db()
    return standing


# --- one-click links -------------------------------------------------------------------


def approval_link_create(*, approval: Approval, user) -> str:
    """A one-click approve link for ``user`` (a path with the token in its fragment): HMAC-signed
    with SECRET_KEY, bound to this approval and this approver, expiring with the approval (at most
    24 h), usable once. The token never sits in the URL's path or query, which access logs, traces
    and proxies record: a browser does not send the fragment; the page's own script POSTs it."""
    if not has_permission(user, approval.workspace_id, Permission.APPROVE):
        raise ApprovalError("PERMISSION_DENIED", "your role in this workspace does not allow approving", 403)
    if approval.status != ApprovalStatus.PENDING:
        raise ApprovalError("CONFLICT", f"this approval is already {approval.status}", 409)
    expires = min(approval.expires_at, timezone.now() + LINK_TTL)
    token = django_signing.dumps(
        {"a": str(approval.pk), "u": user.pk, "n": secrets.token_urlsafe(16), "e": int(expires.timestamp())},
        salt=LINK_SALT,
    )
    with transaction.atomic():
        writer.append(
            trace_id=approval.trace_id, type="approval.link_created", stage="approval",
            summary=f"{approval.step_id}: one-click approve link created for {user.get_username()}",
            workspace_id=approval.workspace_id, actor=writer.actor_for(user), refs=_refs(approval),
            payload={"expires_at": expires.isoformat()}, secrets=[token],
        )  # fmt: skip
    return f"{reverse('approval-link')}#{token}"


def approval_link_read(token: str) -> tuple[Approval, Any, str]:
    """(approval, approver, link nonce) for a valid, unexpired, unused link; ApprovalError otherwise."""
    try:
        data = django_signing.loads(token, salt=LINK_SALT)
        approval_id, user_id, nonce, expires = data["a"], data["u"], str(data["n"]), int(data["e"])
    except (django_signing.BadSignature, KeyError, TypeError, ValueError):
        raise ApprovalError("INVALID_ARGUMENT", "this approval link is not valid", 400)
    if timezone.now().timestamp() >= expires:
        raise ApprovalError("INVALID_ARGUMENT", "this approval link has expired", 400)
    if ConsumedNonce.objects.filter(nonce=f"link:{nonce}").exists():
        raise ApprovalError("CONFLICT", "this approval link was already used", 409)
    approval = Approval.objects.filter(pk=approval_id).first()
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if approval is None or user is None:
        raise ApprovalError("INVALID_ARGUMENT", "this approval link is not valid", 400)
    return approval, user, nonce


@transaction.atomic
def approval_link_confirm(*, token: str) -> Approval:
    """Approve through a one-click link: the link's nonce is consumed with the decision, so it works once."""
    approval, user, nonce = approval_link_read(token)
    try:
        with transaction.atomic():
            ConsumedNonce.objects.create(nonce=f"link:{nonce}", approval_id=approval.pk)
    except IntegrityError:
        raise ApprovalError("CONFLICT", "this approval link was already used", 409)
    return approval_decide(approval_id=approval.pk, user=user, decision=Decision.APPROVE, via="link")


# --- runs that stop waiting -----------------------------------------------------------


@transaction.atomic
def approvals_invalidate_for_run(*, run_id: Any, actor: str, reason: str) -> int:
    """The run was cancelled: its open approvals can never be used, so take them off the queue."""
    live = list(Approval.objects.select_for_update().filter(run_id=run_id, status__in=LIVE_STATUSES))
    for approval in live:
        Approval.objects.filter(pk=approval.pk).update(
            status=ApprovalStatus.INVALIDATED, settled_at=timezone.now()
        )
        writer.append(
            trace_id=approval.trace_id or uuid.uuid4().hex, type="approval.invalidated",
            summary=f"{approval.step_id}: {reason}", outcome=Outcome.INFO, workspace_id=approval.workspace_id,
            actor=actor, refs=_refs(approval), payload={"reason": reason, "previous_status": approval.status},
        )  # fmt: skip
    return len(live)


@transaction.atomic
def approvals_settle_for_step(*, run_id: Any, step_key: str, actor: str, reason: str) -> int:
    """The step failed before it could use its approval: take the approval off the queue and settle it,
    so the expiry sweep stops re-sending the run its decision."""
    open_ = list(
        Approval.objects.select_for_update().filter(run_id=run_id, step_key=step_key, settled_at__isnull=True)
    )
    now = timezone.now()
    for approval in open_:
        live = approval.status in LIVE_STATUSES
        Approval.objects.filter(pk=approval.pk).update(
            status=ApprovalStatus.INVALIDATED if live else approval.status, settled_at=now
        )
        if live:
            writer.append(
                trace_id=approval.trace_id or uuid.uuid4().hex, type="approval.invalidated",
                summary=f"{approval.step_id}: {reason}"[:500], outcome=Outcome.INFO,
                workspace_id=approval.workspace_id, actor=actor, refs=_refs(approval),
                payload={"reason": reason, "previous_status": approval.status},
            )  # fmt: skip
    return len(open_)
