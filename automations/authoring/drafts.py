"""Drafting automations from a sentence (SPEC §10): writes and reads of drafts.

``draft_create`` asks the model for a definition, validates it exactly as a
save would (SPEC §3), feeds the problems back for at most ``MAX_ROUNDS``
rounds, then asks a reviewer pass for a plain-language summary and flags,
which are combined with the same checks done deterministically. The result
is a :class:`~automations.models.Draft`: transient (it expires after
``LLM_DRAFT_TTL_SECONDS``) and inert. Only ``draft_save``, called for a
person with the operator role, turns it into an automation or a new version;
there is no auto-save. Both are audited (``draft.created``, ``draft.saved``
with the prompt's sha256, the model and the saver).

A model that never produces a valid definition gets a 422 with the last
round's problems and leaves nothing behind.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from audit import writer
from capabilities import llm
from capabilities.credentials import credential_names
from config.errors import ServiceError
from workspaces.access import has_permission, workspaces_for
from workspaces.models import Permission, Workspace

from .. import definition as defs
from .. import services
from ..models import Automation, Draft, DraftStatus
from . import context, flags

MAX_ROUNDS = 3
MAX_PROMPT_CHARS = 8000
MAX_SUMMARY_CHARS = 2000
GENERATOR_MAX_TOKENS = 8192
REVIEWER_MAX_TOKENS = 1500


class DraftNotFound(ServiceError):
    def __init__(self) -> None:
        super().__init__("NOT_FOUND", "draft not found (drafts expire)", 404)


def _refuse_unless(user, workspace_id: int, permission: str, doing: str) -> None:
    if not has_permission(user, workspace_id, permission):
        raise ServiceError(
            "PERMISSION_DENIED", f"{doing} needs the '{permission}' permission in the workspace", 403
        )


def _check_prompt(prompt: Any) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise ServiceError("INVALID_ARGUMENT", "prompt must be a non-empty string", 400,
                           errors=[{"path": "/prompt", "code": "required", "message": "prompt is required"}])  # fmt: skip
    if len(prompt) > MAX_PROMPT_CHARS:
        raise ServiceError("INVALID_ARGUMENT", "prompt is too long", 400, errors=[
            {"path": "/prompt", "code": "too_long", "message": f"at most {MAX_PROMPT_CHARS} characters"}])  # fmt: skip
    return prompt.strip()


def _problems(
    answer: str | None, workspace: Workspace, names: set[str]
) -> tuple[Any, list[dict[str, str]], list[dict[str, str]]]:
    """(definition, problems to feed back, missing credentials) for one answer."""
    definition = context.parse_json_object(answer)
    if definition is None:
        return None, [{"path": "/", "code": "not_json", "message": "the answer was not one JSON object"}], []
    if defs.definition_size(definition) > defs.MAX_DEFINITION_BYTES:
        return None, [{"path": "/", "code": "too_large", "message": "the definition is too large"}], []
    issues = defs.validate_definition(definition, workspace_id=workspace.id, credential_names=names)
    missing = [i for i in issues if i["code"] == "unknown_credential"]
    return definition, [i for i in issues if i["code"] != "unknown_credential"], missing


def _pretty(definition: Any) -> list[str]:
    return json.dumps(definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines(keepends=True)


def definition_diff(before: Any, after: Any, version: int) -> str:
    return "".join(difflib.unified_diff(_pretty(before), _pretty(after), f"version {version}", "draft"))


def _known_capabilities(workspace: Workspace) -> set[str]:
    known: set[str] = set()
    for definition in Automation.objects.filter(workspace=workspace).values_list("definition", flat=True)[
        :1000
    ]:
        if isinstance(definition, dict):
            known |= flags.capabilities_used(definition)
    return known


def _review(client: llm.LlmClient, prompt: str, definition: dict) -> tuple[str, Any, llm.Usage]:
    completion = client.chat(context.reviewer_messages(prompt=prompt, definition=definition),
                             max_tokens=REVIEWER_MAX_TOKENS)  # fmt: skip
    review = context.parse_json_object(completion.content) or {}
    summary = review.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        summary = "(the reviewer's answer could not be used: rely on the definition and the flags)"
    return summary.strip()[:MAX_SUMMARY_CHARS], review.get("flags"), completion.usage


def draft_create(*, workspace: Workspace, user, prompt: Any, automation: Automation | None = None) -> Draft:
    """Generate, validate (≤ 3 rounds), review and store a draft. Saves nothing else."""
    client = llm.require_llm()
    _refuse_unless(user, workspace.id, Permission.OPERATE, "drafting an automation")
    prompt = _check_prompt(prompt)
    if automation is not None and automation.workspace_id != workspace.id:
        raise ServiceError("NOT_FOUND", "automation not found", 404)
    started = time.perf_counter()
    model_seconds = 0.0
    names = credential_names(workspace.id)
    current = automation.definition if automation is not None else None
    messages = context.generator_messages(workspace=workspace, prompt=prompt, current=current)
    usage = llm.Usage()
    definition: Any = None
    problems: list[dict[str, str]] = []
    missing: list[dict[str, str]] = []
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - rounds is recorded below
        call_started = time.perf_counter()
        completion = client.chat(messages, max_tokens=GENERATOR_MAX_TOKENS)
        model_seconds += time.perf_counter() - call_started
        usage += completion.usage
        definition, problems, missing = _problems(completion.content, workspace, names)
        if not problems:
            break
        messages += [context.echo(completion.content or ""), context.feedback_message(problems)]
    else:
        gave_up = {"path": "/", "code": "draft_gave_up",
                   "message": f"the model did not produce a valid definition in {MAX_ROUNDS} rounds"}  # fmt: skip
        raise ServiceError("INVALID_ARGUMENT", gave_up["message"], 422, errors=[gave_up, *problems[:50]])
    call_started = time.perf_counter()
    summary, reviewer_flags, review_usage = _review(client, prompt, definition)
    model_seconds += time.perf_counter() - call_started
    usage += review_usage
    checked = flags.deterministic_flags(
        definition, workspace_id=workspace.id,
        known_capabilities=_known_capabilities(workspace), missing_credentials=missing,
    )  # fmt: skip
    platform_ms = (time.perf_counter() - started - model_seconds) * 1000
    with transaction.atomic():
        draft = Draft.objects.create(
            workspace=workspace, automation=automation,
            base_version=automation.version if automation is not None else None,
            prompt=prompt, prompt_sha256=hashlib.sha256(prompt.encode()).hexdigest(), model=client.model,
            definition=definition, rounds=rounds, summary=summary, flags=flags.combine(checked, reviewer_flags),
            diff=definition_diff(current, definition, automation.version) if automation is not None else "",
            usage={**usage.as_dict(), "model_ms": round(model_seconds * 1000, 1), "platform_ms": round(platform_ms, 1)},
            cost_usd=llm.cost_usd(client.model, usage), created_by=user if user.is_authenticated else None,
            expires_at=timezone.now() + timedelta(seconds=settings.LLM_DRAFT_TTL_SECONDS),
        )  # fmt: skip
        writer.append(
            trace_id=uuid.uuid4().hex, type="draft.created", summary=f"draft from a prompt ({rounds} round(s))",
            workspace_id=workspace.id, actor=writer.actor_for(user),
            refs={"draft": str(draft.pk), **({"automation": str(automation.pk)} if automation else {})},
            payload={"prompt_sha256": draft.prompt_sha256, "model": draft.model, "rounds": rounds,
                     "usage": usage.as_dict(), "cost_usd": str(draft.cost_usd), "flags": len(draft.flags)},
        )  # fmt: skip
    return draft


def _locked_ready_draft(draft: Draft) -> Draft:
    locked = Draft.objects.select_for_update().filter(pk=draft.pk, expires_at__gt=timezone.now()).first()
    if locked is None:
        raise DraftNotFound()
    if locked.status != DraftStatus.READY:
        raise ServiceError("CONFLICT", f"this draft was already {locked.status}", 409)
    return locked


@transaction.atomic
def draft_save(*, draft: Draft, user) -> Automation:
    """A person with the operator role turns the draft into an automation (or its next version)."""
    if user is None or not user.is_authenticated:
        raise ServiceError("PERMISSION_DENIED", "saving a draft is a person's decision", 403)
    _refuse_unless(user, draft.workspace_id, Permission.OPERATE, "saving a draft")
    draft = _locked_ready_draft(draft)
    if draft.automation_id is None:
        automation = services.automation_create(
            workspace=draft.workspace, definition=draft.definition, user=user
        )
    else:
        automation = Automation.objects.select_for_update(no_key=True).get(pk=draft.automation_id)
        if automation.version != draft.base_version:
            raise ServiceError("CONFLICT", f"the automation changed since this draft (now version "
                                           f"{automation.version}); draft the edit again", 409)  # fmt: skip
        automation = services.automation_update(automation=automation, user=user, definition=draft.definition)
    Draft.objects.filter(pk=draft.pk).update(
        status=DraftStatus.SAVED, automation=automation, saved_by=user, saved_version=automation.version
    )
    writer.append(
        trace_id=uuid.uuid4().hex, type="draft.saved", summary=f"draft saved as {automation.name} v{automation.version}",
        workspace_id=draft.workspace_id, actor=writer.actor_for(user),
        refs={"draft": str(draft.pk), "automation": str(automation.pk)},
        payload={"prompt_sha256": draft.prompt_sha256, "model": draft.model, "saved_by": writer.actor_for(user),
                 "version": automation.version, "rounds": draft.rounds,
                 "definition_sha256": hashlib.sha256(writer.canonical_json(draft.definition).encode()).hexdigest()},
    )  # fmt: skip
    return automation


@transaction.atomic
def draft_discard(*, draft: Draft, user) -> None:
    _refuse_unless(user, draft.workspace_id, Permission.OPERATE, "discarding a draft")
    draft = _locked_ready_draft(draft)
    Draft.objects.filter(pk=draft.pk).update(status=DraftStatus.DISCARDED)
    writer.append(
        trace_id=uuid.uuid4().hex, type="draft.discarded", summary="draft discarded",
        workspace_id=draft.workspace_id, actor=writer.actor_for(user), refs={"draft": str(draft.pk)},
    )  # fmt: skip


def drafts_visible_to(user) -> QuerySet[Draft]:
    """Unexpired drafts of the workspaces the user can see."""
    return Draft.objects.filter(workspace__in=workspaces_for(user), expires_at__gt=timezone.now())


def drafts_purge_expired() -> int:
    return Draft.objects.filter(expires_at__lte=timezone.now()).delete()[0]
