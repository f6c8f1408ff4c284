"""Definitions as code (issue 34): the document an automation exports to, and the plan an apply runs.

A document is ``{"slug", "status", "definition"}``: the definition holds the triggers' configuration,
credentials are named, and nothing in it is a secret (webhook tokens and signing secrets live on the
trigger rows, credentials' values in the credential store). Identity: an automation is matched by
the *slug of its name* within the workspace, so renaming one is an archive and a create.

The management command ``automations`` and the API's ``export`` and ``apply`` both call these.
"""

from __future__ import annotations

import difflib
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.db import DatabaseError, transaction
from django.utils.text import slugify

from audit import writer
from capabilities import registry
from capabilities.credentials import credential_grants, decrypt, secret_values
from capabilities.models import Credential
from config.errors import InvalidArgument, ServiceError
from workspaces.models import Workspace

from . import definition as defs
from . import services
from .expressions.template import is_template
from .models import ACTIVE_RUN_STATUSES, Automation, AutomationStatus

DOCUMENT_KEYS = frozenset({"slug", "status", "definition"})
AUTONOMY_ORDER = ("A0", "A1", "A2", "A3", "A4")
ACTIONS = ("create", "update", "unchanged", "archive")
# Actions that reach nothing outside the run: starting to use one raises no risk.
INERT_ACTIONS = frozenset({"transform_data", "wait", "require_approval"})

# Secrets that have no place in a definition: well-known token shapes (autoplane's own webhook
# and API tokens, Standard Webhooks secrets, common providers'), and literal values under keys
# that name a secret (a template there reads a credential or an input, which is fine).
_SECRET_SHAPES = re.compile(
    r"(apt_|apk_)[A-Za-z0-9_-]{20,}|whsec_[A-Za-z0-9+/=]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abpr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
)
_SECRET_KEYS = re.compile(r"(?i)^(authorization|proxy-authorization|password|passwd|secret|client_secret|"
                          r"api[-_]?key|x-api-key|access[-_]?token|token|private[-_]?key)$")  # fmt: skip


def automation_slug(name: Any) -> str:
    return slugify(str(name), allow_unicode=True) or "automation"


# --- the document ----------------------------------------------------------------------------


def automation_document(automation: Automation) -> dict[str, Any]:
    """What ``export`` writes for one automation (no ids, versions or times: two exports of an
    unchanged automation are byte-identical, and one applied elsewhere exports the same)."""
    return {
        "slug": automation_slug(automation.name),
        "status": automation.status,
        "definition": automation.definition,
    }


def document_text(document: Mapping[str, Any], fmt: str = "json") -> str:
    """Sorted keys, lists in their order, two-space indents and a final newline: small diffs."""
    if fmt == "yaml":
        return yaml.safe_dump(
            document, sort_keys=True, allow_unicode=True, default_flow_style=False, width=100000
        )
    return json.dumps(document, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def document_parse(text: str, fmt: str) -> Any:
    """A file's text as a JSON value; ``ValueError`` with a readable message when it is none."""
    if fmt == "yaml":
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"not valid YAML: {exc}".splitlines()[0]) from None
        try:  # YAML has dates and other types JSON has not
            return json.loads(json.dumps(value))
        except (TypeError, ValueError):
            raise ValueError("the YAML holds a value JSON cannot (a date, a set, ...): quote it") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from None


def workspace_documents(workspace: Workspace) -> dict[str, dict[str, Any]]:
    """Every live automation's document by slug; two automations with one slug are refused."""
    documents: dict[str, dict[str, Any]] = {}
    for automation in Automation.objects.filter(workspace=workspace, archived_at__isnull=True).order_by(
        "name"
    ):
        document = automation_document(automation)
        if document["slug"] in documents:
            raise ServiceError(
                "CONFLICT", f"two automations share the slug '{document['slug']}': rename one", 409
            )
        documents[document["slug"]] = document
    return documents


# --- risk ------------------------------------------------------------------------------------


@dataclass
class RiskProfile:
    credentials: set[str] = field(default_factory=set)
    capabilities: set[str] = field(default_factory=set)
    triggers: set[tuple[str, str]] = field(default_factory=set)  # (type, key) of webhooks and schedules
    autonomy: str = "A3"


def risk_profile(definition: Mapping[str, Any], workspace: Workspace) -> RiskProfile:
    profile = RiskProfile()
    execution = definition.get("execution") or {}
    profile.autonomy = str(execution.get("autonomy") or workspace.default_autonomy)
    for step in [*(definition.get("plan") or []), *(execution.get("on_failure") or [])]:
        action_name = str(step.get("action", ""))
        if action_name not in INERT_ACTIONS:
            profile.capabilities.add(action_name)
        config = step.get("config") or {}
        if isinstance(config.get("credential"), str):
            profile.credentials.add(config["credential"])
        for name in config.get("credentials") or []:
            if isinstance(name, str):
                profile.credentials.add(name)
        action = registry.get_action(action_name)
        if action is not None:
            try:
                profile.capabilities.update(str(used) for used in action.uses(config))
            except (KeyError, TypeError, AttributeError):
                pass
    for trigger in definition.get("triggers") or []:
        if trigger.get("type") in ("webhook", "schedule"):
            profile.triggers.add((str(trigger["type"]), str(trigger.get("key", ""))))
    return profile


def risk_raised(old: Mapping[str, Any], new: Mapping[str, Any], workspace: Workspace) -> list[str]:
    """Why ``new`` may do more than ``old`` did, one sentence each (empty: it may not)."""
    before, after = risk_profile(old, workspace), risk_profile(new, workspace)
    reasons = [f"uses credential '{name}'" for name in sorted(after.credentials - before.credentials)]
    reasons += [f"calls '{name}'" for name in sorted(after.capabilities - before.capabilities)]
    reasons += [f"new {kind} trigger '{key}'" for kind, key in sorted(after.triggers - before.triggers)]
    rank = {level: i for i, level in enumerate(AUTONOMY_ORDER)}
    if rank.get(after.autonomy, 0) > rank.get(before.autonomy, 0):
        reasons.append(f"autonomy {before.autonomy} -> {after.autonomy}")
    return reasons


# --- apply -----------------------------------------------------------------------------------


@dataclass
class Source:
    """One document to apply and where it came from (a file name, or ``automations/3``)."""

    name: str
    document: Any = None
    error: str | None = None  # the file could not be read or parsed


class ApplyInvalid(InvalidArgument):
    def __init__(self, errors: list[dict[str, str]]):
        super().__init__(errors, f"{len(errors)} problem(s): nothing was applied")


@dataclass
class _Item:
    source: Source
    slug: str
    status: str | None
    definition: dict[str, Any]


_Planned = tuple[str, "_Item | None", "Automation | None", list[str]]


def _error(source: Source, path: str, code: str, message: str) -> dict[str, str]:
    return {"file": source.name, "path": path, "code": code, "message": message}


def _strings(value: Any, path: str = "") -> Iterable[tuple[str, str | None, str]]:
    """(pointer, the key it is under, string) for every string in a JSON value."""
    if isinstance(value, str):
        yield path, None, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            pointer = f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"
            if isinstance(item, str):
                yield pointer, str(key), item
            else:
                yield from _strings(item, pointer)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}/{i}")


def _workspace_secrets(workspace: Workspace) -> list[str]:
    values: list[str] = []
    for credential in Credential.objects.filter(workspace=workspace):
        try:
            values += secret_values(credential.kind, decrypt(credential.encrypted_value))
        except Exception:  # noqa: BLE001, S112 - an undecryptable credential has no value to look for
            continue
    return [value for value in values if len(value) >= 8]


def _secret_errors(source: Source, definition: Any, known_secrets: Sequence[str]) -> list[dict[str, str]]:
    errors = []
    for pointer, key, text in _strings(definition, "/definition"):
        if any(secret in text for secret in known_secrets):
            why = "holds a credential's secret value"
        elif _SECRET_SHAPES.search(text):
            why = "looks like a token or key"
        elif key is not None and _SECRET_KEYS.match(key) and len(text) >= 8 and not is_template(text):
            why = f"puts a literal value under '{key}'"
        else:
            continue
        errors.append(_error(source, pointer, "secret_in_definition",
                             f"{why}: a definition names a credential, it never holds a secret"))  # fmt: skip
    return errors


def _parse(sources: Sequence[Source]) -> tuple[list[_Item], list[dict[str, str]]]:
    items: list[_Item] = []
    errors: list[dict[str, str]] = []
    for source in sources:
        if source.error is not None:
            errors.append(_error(source, "", "invalid_document", source.error))
            continue
        document = source.document
        if not isinstance(document, dict):
            errors.append(_error(source, "", "invalid_document", "a document is a JSON object"))
            continue
        problems = [_error(source, f"/{key}", "unknown_key", f"unknown key '{key}' (a document has "
                           "slug, status and definition)") for key in sorted(set(document) - DOCUMENT_KEYS)]  # fmt: skip
        definition = document.get("definition")
        if not isinstance(definition, dict):
            problems.append(_error(source, "/definition", "required", "definition is a JSON object"))
        status = document.get("status")
        if status is not None and status not in AutomationStatus.values:
            problems.append(_error(source, "/status", "invalid_status", "status is active or paused"))
        if problems or not isinstance(definition, dict):
            errors += problems
            continue
        slug = automation_slug(definition.get("name", ""))
        if "slug" in document and document["slug"] != slug:
            errors.append(_error(source, "/slug", "slug_mismatch", f"the slug of the name "
                                 f"'{definition.get('name')}' is '{slug}', not '{document['slug']}'"))  # fmt: skip
            continue
        items.append(_Item(source, slug, status, definition))
    seen: dict[str, _Item] = {}
    for item in items:
        if item.slug in seen:
            errors.append(_error(item.source, "/slug", "duplicate_slug",
                                 f"'{item.slug}' is also in {seen[item.slug].source.name}"))  # fmt: skip
        else:
            seen[item.slug] = item
    return items, errors


def _existing(workspace: Workspace) -> dict[str, Automation]:
    by_slug: dict[str, Automation] = {}
    for automation in Automation.objects.filter(workspace=workspace, archived_at__isnull=True).order_by(
        "name"
    ):
        slug = automation_slug(automation.name)
        if slug in by_slug:
            raise ServiceError("CONFLICT", f"two automations in the workspace share the slug '{slug}': "
                               "rename one before applying", 409)  # fmt: skip
        by_slug[slug] = automation
    return by_slug


def _lock(workspace: Workspace) -> None:
    """One apply at a time per workspace: the second sees a conflict rather than waiting."""
    try:
        list(Workspace.objects.select_for_update(nowait=True, no_key=True).filter(pk=workspace.pk))
    except DatabaseError:
        raise ServiceError(
            "CONFLICT", "another apply is in progress in this workspace; try again", 409
        ) from None


def _diff(slug: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    lines = difflib.unified_diff(document_text(old).splitlines(keepends=True),
                                 document_text(new).splitlines(keepends=True),
                                 fromfile=f"{slug} (current)", tofile=f"{slug} (applied)")  # fmt: skip
    return "".join(lines)


def _change(slug: str, action: str, automation: Automation | None = None, *, version: int | None = None,
            diff: str = "", review: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    return {
        "slug": slug, "action": action, "automation": str(automation.pk) if automation else None,
        "version": version if version is not None else (automation.version if automation else None),
        "diff": diff, "review": list(review),
    }  # fmt: skip


def apply_documents(
    *,
    workspace: Workspace,
    sources: Sequence[Source],
    user=None,
    dry_run: bool = False,
    prune: bool = False,
    actor: str | None = None,
) -> dict[str, Any]:
    """Plan, and unless ``dry_run`` apply, every document into ``workspace`` in one transaction.

    Any document that does not validate fails the whole apply (``ApplyInvalid``, each error
    with its file and path) and nothing is written. Applying the same documents again changes
    nothing. An update that raises the automation's risk leaves it paused with a review flag.
    """
    items, errors = _parse(sources)
    with transaction.atomic():
        if not dry_run:
            _lock(workspace)
        existing = _existing(workspace)
        grants = credential_grants(workspace.id)
        known_secrets = _workspace_secrets(workspace)
        for item in items:
            current = existing.get(item.slug)
            for problem in defs.validate_definition(
                item.definition, workspace_id=workspace.id, credential_names=set(grants),
                credential_grants=grants, automation_id=current.pk if current else None,
            ):  # fmt: skip
                errors.append(_error(item.source, "/definition" + problem["path"], problem["code"],
                                     problem["message"]))  # fmt: skip
            errors += _secret_errors(item.source, item.definition, known_secrets)
        if errors:
            raise ApplyInvalid(errors)
        changes: list[dict[str, Any]] = []
        plans: list[_Planned] = []
        for item in sorted(items, key=lambda i: i.slug):
            current = existing.get(item.slug)
            if current is None:
                plans.append(("create", item, None, []))
                changes.append(_change(item.slug, "create", version=1))
                continue
            status = item.status or current.status
            if current.review_required:
                status = AutomationStatus.PAUSED  # only an admin's review activates it
            review = risk_raised(current.definition, item.definition, workspace)
            if review:
                status = AutomationStatus.PAUSED
            if item.definition == current.definition and status == current.status:
                changes.append(_change(item.slug, "unchanged", current))
                continue
            old_document = automation_document(current)
            new_document = {**old_document, "definition": item.definition, "status": status}
            version = current.version + (item.definition != current.definition)
            plans.append(("update", item, current, review))
            changes.append(_change(item.slug, "update", current, version=version,
                                   diff=_diff(item.slug, old_document, new_document), review=review))  # fmt: skip
        wanted = {item.slug for item in items}
        if prune:
            for slug, automation in sorted(existing.items()):
                if slug in wanted:
                    continue
                if automation.runs.filter(status__in=ACTIVE_RUN_STATUSES).exists():
                    raise ServiceError("CONFLICT", f"'{slug}' has runs in flight: cancel them or let them "
                                       "finish before pruning it (nothing was applied)", 409)  # fmt: skip
                plans.append(("archive", None, automation, []))
                changes.append(_change(slug, "archive", automation))
        if not dry_run:
            _execute(plans, changes, workspace, user)
            if plans:
                writer.append(
                    trace_id=uuid.uuid4().hex, type="automations.applied",
                    summary=f"apply: {_counts_text(changes)}", workspace_id=workspace.id,
                    actor=actor or writer.actor_for(user),
                    payload={"prune": prune, "changes": [
                        {k: change[k] for k in ("slug", "action", "automation", "version", "review")}
                        for change in changes if change["action"] != "unchanged"
                    ]},
                )  # fmt: skip
    return {
        "workspace": workspace.slug, "dry_run": dry_run, "prune": prune,
        "counts": {action: sum(c["action"] == action for c in changes) for action in ACTIONS},
        "changes": changes,
    }  # fmt: skip


def _execute(plans: list[_Planned], changes: list[dict[str, Any]], workspace: Workspace, user) -> None:
    by_slug = {change["slug"]: change for change in changes}
    for action, item, automation, review in plans:
        if action == "create" and item is not None:
            created = services.automation_create(
                workspace=workspace, definition=item.definition, user=user, status=item.status
            )
            by_slug[item.slug].update(automation=str(created.pk), version=created.version)
        elif action == "update" and item is not None and automation is not None:
            status = AutomationStatus.PAUSED if (review or automation.review_required) else item.status
            saved = services.automation_update(
                automation=automation, user=user, definition=item.definition, status=status
            )
            if review:
                reasons = list(dict.fromkeys([*automation.review_reasons, *review]))
                Automation.objects.filter(pk=saved.pk).update(review_required=True, review_reasons=reasons)
            by_slug[item.slug].update(version=saved.version)
        elif automation is not None:
            services.automation_archive(automation=automation, user=user)


def _counts_text(changes: Sequence[Mapping[str, Any]]) -> str:
    counts = {action: sum(c["action"] == action for c in changes) for action in ACTIONS}
    return ", ".join(f"{counts[action]} {action}" for action in ACTIONS)


def plan_text(plan: Mapping[str, Any]) -> str:
    """The plan as ``manage.py automations apply`` prints it: one line per automation, diffs after updates."""
    lines = []
    for change in plan["changes"]:
        line = f"{change['action']:<10} {change['slug']}"
        if change["review"]:
            line += f"  (paused for review: {'; '.join(change['review'])})"
        lines.append(line)
        if change["diff"]:
            lines += ["    " + diff_line for diff_line in change["diff"].rstrip("\n").splitlines()]
    done = "dry run: nothing written" if plan["dry_run"] else "applied"
    lines.append(f"plan for workspace {plan['workspace']}: {_counts_text(plan['changes'])} ({done})")
    return "\n".join(lines) + "\n"
