"""The approval gate the executor calls for a ``confirm`` step (SPEC §7.3).

``check_step`` answers whether the step may run *now*:

1. a **standing approval** for this automation *version* and capability that is
   unrevoked, unexpired, under its use limit, signed by the current key and whose
   argument constraint accepts the rendered config (an agent tool call: the tool's
   own arguments) → ``approved`` (one use is taken with a conditional UPDATE, so
   concurrent runs cannot overspend it). A standing approval granted for another
   version of the automation is void for this run (an edit is never pre-approved);
2. otherwise the step's **Approval** for this run decides:

   ========================  ==============================================
   no approval yet           create one (``pending``, ``created=True``)
   plan hash differs         invalidate the old one, create a new one
   pending                   ``pending`` (``expired`` once past its expiry)
   denied / expired          ``denied`` / ``expired`` (whatever the plan hash)
   approved                  verify the token, consume its nonce → ``approved``
   consumed / invalidated    create a fresh one: a token is never reused
   ========================  ==============================================

A row flipped to ``approved`` in the database has no valid token and is
refused; a token copied from elsewhere is bound to another approval, run or
step; a token whose nonce is already in ``ConsumedNonce`` is a replay. Every
refusal is audited and leaves the approval ``invalidated``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone
from jsonschema.exceptions import SchemaError

from audit import writer
from audit.models import Outcome
from audit.redaction import redact
from capabilities import json_schema
from config import instruments
from workspaces.models import Workspace

from . import tokens
from .models import Approval, ApprovalStatus, ConsumedNonce, StandingApproval

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GateRequest:
    workspace_id: int
    run_id: str
    automation_id: str
    automation_name: str
    step_key: str  # "<phase>:<index>:<step_id>", unique within the run
    step_id: str
    action: str
    capability_id: str
    risk: str
    reasons: list[str]
    what: Any  # the exact rendered config (credential values never appear here)
    message: str
    plan_hash: str
    requested_by: str
    last_editor_id: int | None
    approvals_required: int
    expires_in_seconds: int
    trace_id: str
    # Optional: "autonomy" (shown in ``why``), "secrets" (values redacted from what is stored).
    extra: dict[str, Any] = field(default_factory=dict)
    # The people behind the run (user ids): under four-eyes none of them may approve it.
    principal_ids: tuple[int, ...] = ()
    # An explicit human checkpoint (require_approval): standing approvals never cover it.
    always_asks_human: bool = False
    # The automation version the run executes: standing approvals granted for another are void.
    automation_version: int | None = None
    # What a standing approval's arg_constraint is matched against when not ``what`` itself
    # (an agent tool call: the tool's own arguments, not ``{"tool", "args"}``).
    constraint_subject: Any = None
    # Why a workspace policy makes this step ask (a rule, a credential that always asks, quiet
    # hours): shown to the approver; standing approvals never cover it either.
    asked_because: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    status: str  # approved | pending | denied | expired | invalid
    message: str = ""
    approval_id: str | None = None
    # True when this call created the pending approval (the caller publishes approval.requested).
    created: bool = False
    why: str = ""
    expires_at: datetime | None = None
    # The step's error code when it must not run and the status alone does not say (APPROVAL_INVALID).
    code: str = ""


def check_step(request: GateRequest) -> Verdict:
    now = timezone.now()
    if not request.always_asks_human and not request.asked_because:
        verdict = _use_standing(request, now)
        if verdict is not None:
            return verdict
    try:
        with transaction.atomic():
            return _decide(request, now)
    except IntegrityError:
        # Another executor created the live approval for this step at the same moment.
        with transaction.atomic():
            live = _latest(request)
        if live is not None and live.status == ApprovalStatus.PENDING and live.plan_hash == request.plan_hash:
            return _pending(live)
        raise


# --- standing approvals ---------------------------------------------------------


def standing_bounds(standing: StandingApproval) -> dict[str, Any]:
    return {
        "standing_id": str(standing.pk),
        "workspace_id": standing.workspace_id,
        "automation_id": str(standing.automation_id),
        "capability_id": standing.capability_id,
        "max_uses": standing.max_uses,
        "expires_at": standing.expires_at,
        "arg_constraint": standing.arg_constraint,
        "created_by": standing.created_by_id,
        "automation_version": standing.automation_version,
    }


def standing_signature_valid(standing: StandingApproval) -> bool:
    return tokens.standing_valid(standing.key_id, standing.signature, **standing_bounds(standing))


def standing_signature_problem(standing: StandingApproval) -> str | None:
    """None, ``bad_signature`` (the bounds were edited) or ``retired_key`` (signed before a rotation)."""
    return tokens.standing_problem(standing.key_id, standing.signature, **standing_bounds(standing))


def _accepts(constraint: Any, what: Any) -> bool:
    """``arg_constraint`` is a JSON Schema over the step's whole rendered config (``what``), or
    over an agent tool call's own arguments.

    For ``call_capability`` that config is ``{"capability": ..., "args": {...}}``,
    so constraints on the arguments go under ``properties.args``.
    """
    if constraint is None:
        return True
    try:
        return json_schema.validator(constraint).is_valid(what)
    except SchemaError:
        return False


def _own_people(request: GateRequest) -> set[int]:
    """Under four-eyes, the users whose say cannot approve this step: the run's principals and
    the automation's last editor. Empty without four-eyes."""
    if not Workspace.objects.filter(pk=request.workspace_id, four_eyes=True).exists():
        return set()
    return {pk for pk in (request.last_editor_id, *request.principal_ids) if pk is not None}


def _use_standing(request: GateRequest, now: datetime) -> Verdict | None:
    candidates = StandingApproval.objects.filter(
        workspace_id=request.workspace_id,
        automation_id=request.automation_id,
        capability_id=request.capability_id,
        # Bound to the version it was granted for: an edit of the automation voids it (issue 29).
        automation_version=request.automation_version,
        revoked=False,
        expires_at__gt=now,
        uses__lt=F("max_uses"),
    ).order_by("expires_at", "created_at")
    subject = request.what if request.constraint_subject is None else request.constraint_subject
    for standing in candidates:
        problem = standing_signature_problem(standing)
        if problem is not None:
            why = ("it was signed by a retired key" if problem == "retired_key"
                   else "its signature does not match its bounds")  # fmt: skip
            with transaction.atomic():
                _audit(request, "approval.standing.rejected", f"standing approval {standing.pk} ignored: {why}",
                       Outcome.FAILURE, refs={"standing_approval": str(standing.pk)},
                       payload={"code": "APPROVAL_INVALID", "reason": problem, "key_id": standing.key_id})  # fmt: skip
            continue
        if not _accepts(standing.arg_constraint, subject):
            continue
        if standing.created_by_id in _own_people(request):
            with transaction.atomic():
                _audit(request, "approval.standing.skipped",
                       f"standing approval {standing.pk} not used: four-eyes, and its creator is behind this "
                       "run or last edited the automation", Outcome.SUPPRESSED,
                       refs={"standing_approval": str(standing.pk)})  # fmt: skip
            continue
        with transaction.atomic():
            taken = StandingApproval.objects.filter(
                pk=standing.pk, revoked=False, expires_at__gt=now, uses__lt=F("max_uses")
            ).update(uses=F("uses") + 1)
            if not taken:
                continue  # used up (or revoked) by someone else just now
            uses = StandingApproval.objects.filter(pk=standing.pk).values_list("uses", flat=True).get()
            _audit(request, "approval.standing.used",
                   f"{request.step_id}: pre-authorised by a standing approval (use {uses} of {standing.max_uses})",
                   Outcome.SUCCESS, refs={"standing_approval": str(standing.pk)},
                   payload={"uses": uses, "max_uses": standing.max_uses, "plan_hash": request.plan_hash})  # fmt: skip
            # A request still waiting for this step is moot now; take it off the approvers' queue.
            live = _latest(request)
            if live is not None and live.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED):
                _invalidate(request, live, "standing_approval", "covered by a standing approval instead")
        return Verdict("approved", "pre-authorised by a standing approval")
    return None


# --- per-step approvals ------------------------------------------------------------


def _latest(request: GateRequest) -> Approval | None:
    return (
        Approval.objects.select_for_update()
        .filter(run_id=request.run_id, step_key=request.step_key)
        .order_by("-created_at")
        .first()
    )


def _decide(request: GateRequest, now: datetime) -> Verdict:
    approval = _latest(request)
    if approval is None:
        return _create(request, now)
    # A denial or expiry ends the step whatever was rendered since: re-rendering must not escape it.
    if approval.status in (ApprovalStatus.DENIED, ApprovalStatus.EXPIRED):
        _settle(approval, now)
        return Verdict(approval.status, _ENDED[approval.status], approval_id=str(approval.pk))
    if approval.plan_hash != request.plan_hash:
        if approval.status in (ApprovalStatus.PENDING, ApprovalStatus.APPROVED):
            _invalidate(request, approval, "plan_changed",
                        "what would run changed after the approval was requested; asking again")  # fmt: skip
        return _create(request, now)
    if approval.status == ApprovalStatus.PENDING:
        if approval.expires_at <= now:
            return _expire_now(request, approval, now)
        return _pending(approval)
    if approval.status == ApprovalStatus.APPROVED:
        return _consume(request, approval, now)
    # consumed (e.g. the worker died after consuming) or invalidated: never run on an old token.
    return _create(request, now)


_ENDED: dict[str, str] = {  # keyed by the stored status text
    ApprovalStatus.DENIED: "the approval was denied",
    ApprovalStatus.EXPIRED: "the approval expired before anyone decided",
}


def _pending(approval: Approval, created: bool = False) -> Verdict:
    return Verdict(
        "pending", "waiting for approval", approval_id=str(approval.pk), created=created,
        why=approval.why, expires_at=approval.expires_at,
    )  # fmt: skip


def why_text(request: GateRequest) -> str:
    if request.always_asks_human:
        text = "explicit approval step"
    else:
        autonomy = request.extra.get("autonomy")
        text = f"{request.risk}-risk step" + (
            f" at autonomy {autonomy}" if autonomy else " needs a human decision"
        )
    if request.reasons:
        text += " (risk raised: " + "; ".join(request.reasons) + ")"
    if request.extra.get("rerun_of"):
        text = f"re-run from a later step asks again: {text}"
    if request.asked_because:
        text += "; asks because of " + "; ".join(request.asked_because)
    return text


def _create(request: GateRequest, now: datetime) -> Verdict:
    secrets = list(request.extra.get("secrets") or ())
    approval = Approval.objects.create(
        workspace_id=request.workspace_id,
        run_id=request.run_id,
        automation_id=request.automation_id,
        automation_name=request.automation_name[:200],
        step_key=request.step_key,
        step_id=request.step_id,
        action=request.action,
        capability_id=request.capability_id,
        risk=request.risk,
        reasons=[*request.reasons, *request.asked_because],
        what=redact(request.what, secrets),
        why=why_text(request),
        message=redact(request.message, secrets),
        plan_hash=request.plan_hash,
        requested_by=request.requested_by,
        last_editor_id=request.last_editor_id,
        principal_ids=sorted(set(request.principal_ids)),
        trace_id=request.trace_id,
        approvals_required=max(1, int(request.approvals_required)),
        expires_at=now + timedelta(seconds=max(1, int(request.expires_in_seconds))),
    )
    refs = {"approval": str(approval.pk)}
    instruments.approval_event("requested")
    _audit(request, "gate.required", f"{request.step_id}: {approval.why}", refs=refs,
           payload={"risk": request.risk, "reasons": request.reasons, "action": request.action,
                    "capability": request.capability_id})  # fmt: skip
    _audit(request, "approval.requested",
           f"{request.step_id}: approval requested ({approval.approvals_required} approver(s))", refs=refs,
           payload={"plan_hash": request.plan_hash, "expires_at": approval.expires_at.isoformat(),
                    "approvals_required": approval.approvals_required, "what": approval.what},
           secrets=secrets)  # fmt: skip
    return _pending(approval, created=True)


def _invalidate(request: GateRequest, approval: Approval, reason: str, summary: str) -> None:
    Approval.objects.filter(pk=approval.pk, status=approval.status).update(status=ApprovalStatus.INVALIDATED)
    _audit(request, "approval.invalidated", f"{request.step_id}: {summary}", Outcome.FAILURE,
           refs={"approval": str(approval.pk)},
           payload={"reason": reason, "previous_status": approval.status,
                    "approved_plan_hash": approval.plan_hash, "plan_hash": request.plan_hash})  # fmt: skip


def _expire_now(request: GateRequest, approval: Approval, now: datetime) -> Verdict:
    if Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.EXPIRED, decided_at=now, settled_at=now
    ):
        instruments.approval_event(ApprovalStatus.EXPIRED)
    _audit(request, "approval.expired", f"{request.step_id}: the approval expired undecided", Outcome.FAILURE,
           refs={"approval": str(approval.pk)})  # fmt: skip
    return Verdict("expired", _ENDED[ApprovalStatus.EXPIRED], approval_id=str(approval.pk))


def _settle(approval: Approval, now: datetime) -> None:
    if approval.settled_at is None:
        Approval.objects.filter(pk=approval.pk, settled_at__isnull=True).update(settled_at=now)


def _consume(request: GateRequest, approval: Approval, now: datetime) -> Verdict:
    refs = {"approval": str(approval.pk)}
    try:
        payload = tokens.verify(
            approval.token, approval_id=str(approval.pk), run_id=request.run_id, step_key=request.step_key,
            plan_hash=request.plan_hash, now=now,
        )  # fmt: skip
    except tokens.TokenInvalid as exc:
        # An unused token that ran out of time is an expiry; anything else is a forgery or a mix-up.
        status = ApprovalStatus.EXPIRED if exc.reason == "expired" else ApprovalStatus.INVALIDATED
        Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
            status=status, settled_at=now
        )
        _audit(request, "approval.token_rejected", f"{request.step_id}: approval token rejected ({exc.reason})",
               Outcome.FAILURE, refs=refs, payload={"reason": exc.reason})  # fmt: skip
        if status == ApprovalStatus.EXPIRED:
            return Verdict(
                "expired", "the approval token expired before the step ran", approval_id=str(approval.pk)
            )
        if exc.reason == "retired_key":
            return Verdict("invalid", f"{exc.message}; the step was not run", approval_id=str(approval.pk),
                           code="APPROVAL_INVALID")  # fmt: skip
        return Verdict("invalid", "the approval could not be verified; the step was not run",
                       approval_id=str(approval.pk))  # fmt: skip
    try:
        with transaction.atomic():
            ConsumedNonce.objects.create(nonce=f"token:{payload['nonce']}", approval_id=approval.pk)
    except IntegrityError:
        Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
            status=ApprovalStatus.INVALIDATED, settled_at=now
        )
        _audit(request, "approval.replay_refused", f"{request.step_id}: approval token already used (replay)",
               Outcome.FAILURE, refs=refs, payload={"key_id": payload["kid"]})  # fmt: skip
        return Verdict("invalid", "this approval was already used; the step was not run again",
                       approval_id=str(approval.pk))  # fmt: skip
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.APPROVED).update(
        status=ApprovalStatus.CONSUMED, settled_at=now
    )
    if not updated:  # cannot happen under the row lock; refuse rather than guess
        raise IntegrityError("approval changed while its token was being consumed")
    _audit(request, "approval.consumed", f"{request.step_id}: approval verified and consumed", Outcome.SUCCESS,
           refs=refs, payload={"key_id": payload["kid"], "plan_hash": request.plan_hash})  # fmt: skip
    return Verdict("approved", "approved", approval_id=str(approval.pk))


def _audit(request: GateRequest, type: str, summary: str, outcome: str = Outcome.INFO, **extra: Any) -> None:
    writer.append(
        trace_id=request.trace_id,
        type=type,
        summary=summary,
        outcome=outcome,
        workspace_id=request.workspace_id,
        stage="gate",
        refs={"run": request.run_id, "step": request.step_id, "automation": request.automation_id,
              **extra.pop("refs", {})},
        actor="system:approvals",
        payload=extra.pop("payload", {}),
        secrets=extra.pop("secrets", ()),
    )  # fmt: skip


def request_again(request: GateRequest, *, max_re_requests: int) -> Verdict | None:
    """``on_expiry: re_request`` (issue 30): after an expiry, a new approval for the step, bound to the
    plan hash computed now; None once the step has expired ``max_re_requests`` + 1 times."""
    with transaction.atomic():
        expired = Approval.objects.filter(
            run_id=request.run_id, step_key=request.step_key, status=ApprovalStatus.EXPIRED
        ).count()
        if expired > max_re_requests:
            return None
        try:
            with transaction.atomic():
                verdict = _create(request, timezone.now())
        except IntegrityError:  # another process asked again first: that approval is the live one
            return None
        _audit(request, "approval.re_requested", f"{request.step_id}: the approval expired; asked again "
               f"({expired} of {max_re_requests})", refs={"approval": str(verdict.approval_id)},
               payload={"plan_hash": request.plan_hash, "re_requests": expired})  # fmt: skip
    return verdict
