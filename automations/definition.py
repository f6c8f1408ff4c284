"""The automation definition: its JSON Schema (2020-12) and the semantic checks of SPEC §3.

``validate_definition`` returns every problem as ``{path, code, message}`` with
a JSON-pointer ``path``; an empty list means the definition may be saved.
"""

from __future__ import annotations

import json
import zoneinfo
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from croniter import croniter
from jsonschema import Draft202012Validator

from capabilities import json_schema, registry
from capabilities.base import ActionDefinition, Capability, Risk, SideEffect
from capabilities.grants import Grant
from config.errors import InvalidArgument
from notifications import services as notices

from .expressions import template
from .expressions.filter_grammar import FILTER_SCHEMA, validate_filter
from .expressions.policy_rules import rule_issues

SCHEMA_VERSION = "1.0"
RESERVED_NAMES = frozenset({"inputs", "trigger", "run", "event"})
INPUT_DEFAULT_TOKENS = frozenset({"$last_fired_at", "$now", "$creator"})
MIN_SCHEDULE_INTERVAL_SECONDS = 60
# A definition's size as UTF-8 compact JSON, checked before anything else on every save path
# (API, admin, drafts, examples): a bigger one costs template-compile CPU for nothing.
MAX_DEFINITION_BYTES = 512 * 1024

_IDENT = "^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"

# Who is told about a step's approval beyond the workspace's channels, and when they are reminded
# and escalated to (notifications/; a step's own settings win over ``execution.approval``).
_RECIPIENTS = {"type": "array", "maxItems": 50, "items": {"type": "string", "minLength": 1, "maxLength": 320}}
_APPROVAL_NOTICES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "notify": _RECIPIENTS,
        "remind_after_seconds": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
        "remind_every_seconds": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
        "escalate_after_seconds": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
        "escalate_to": _RECIPIENTS,
        "on_expiry": {"enum": ["fail", "re_request"]},
        "max_re_requests": {"type": "integer", "minimum": 1, "maximum": 10},
    },
}

_STEP = {
    "type": "object",
    "required": ["step_id", "action"],
    "additionalProperties": False,
    "properties": {
        "step_id": {"type": "string", "pattern": _IDENT},
        "action": {"type": "string", "minLength": 1, "maxLength": 64},
        "description": {"type": "string", "maxLength": 2000},
        "config": {"type": "object"},
        "when": {"type": "string", "minLength": 1},
        "output_as": {"type": "string", "pattern": "^[a-zA-Z][a-zA-Z0-9_]{0,63}$"},
        "max_retries": {"type": "integer", "minimum": 0, "maximum": 10},
        "retry_backoff": {"enum": ["none", "linear", "exponential"]},
        "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "expected_duration_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
        "approvals_required": {"type": "integer", "minimum": 1, "maximum": 5},
        # Argument rules of this step's own (expressions/policy_rules.py), checked by _Checker.
        "policy": {"type": "array"},
        "approval": _APPROVAL_NOTICES,
    },
}

_TRIGGER_CONFIGS = {
    "schedule": {
        "type": "object",
        "required": ["cron"],
        "additionalProperties": False,
        "properties": {
            "cron": {"type": "string", "minLength": 9, "maxLength": 120},
            "timezone": {"type": "string", "minLength": 1, "maxLength": 64},
            "catch_up": {"enum": ["skip", "run_once", "run_all_capped"]},
            "quiet_hours": {
                "enum": ["skip", "run"],
                "description": "skip: inside the workspace's quiet hours "
                "a slot is recorded as schedule.skipped instead of run",
            },
            "inputs": {"type": "object"},
        },
    },
    "webhook": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "input_mapping": {
                "type": "object",
                "additionalProperties": {"type": "string", "pattern": "^\\$", "maxLength": 256},
            },
            "require_signature": {"type": "boolean"},
            "rate_limit_per_minute": {"type": "integer", "minimum": 1, "maximum": 100000},
        },
    },
    "event": {
        "type": "object",
        "required": ["event_type"],
        "additionalProperties": False,
        "properties": {
            "event_type": {"type": "string", "pattern": "^[a-z0-9_.-]{1,128}$"},
            "filter": {"type": "object"},
            "input_mapping": {
                "type": "object",
                "additionalProperties": {"type": "string", "pattern": "^\\$", "maxLength": 256},
            },
        },
    },
}

DEFINITION_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://autoplane.dev/schema/definition.json",
    "title": "autoplane automation definition",
    "type": "object",
    "required": ["schema_version", "name", "plan"],
    "additionalProperties": False,
    "properties": {
        "schema_version": {"const": SCHEMA_VERSION},
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "goal": {"type": "string", "maxLength": 4000},
        "inputs": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"schema": {"type": "object"}},
        },
        "triggers": {"type": "array", "maxItems": 20, "items": {"$ref": "#/$defs/trigger"}},
        "plan": {"type": "array", "minItems": 1, "maxItems": 100, "items": {"$ref": "#/$defs/step"}},
        "execution": {"$ref": "#/$defs/execution"},
        "metadata": {"type": "object"},
    },
    "$defs": {
        "step": _STEP,
        "trigger": {
            "type": "object",
            "required": ["key", "type"],
            "additionalProperties": False,
            "properties": {
                "key": {"type": "string", "pattern": _IDENT},
                "type": {"enum": sorted(_TRIGGER_CONFIGS)},
                "enabled": {"type": "boolean"},
                "config": {"type": "object"},
            },
            "allOf": [
                {
                    "if": {"properties": {"type": {"const": kind}}, "required": ["type"]},
                    "then": {"properties": {"config": schema}},
                }
                for kind, schema in _TRIGGER_CONFIGS.items()
            ],
        },
        "execution": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "timeout_seconds": {"type": "number", "exclusiveMinimum": 0, "maximum": 86400},
                "max_retries": {"type": "integer", "minimum": 0, "maximum": 10},
                "retry_backoff": {"enum": ["none", "linear", "exponential"]},
                "concurrency": {"enum": ["drop_if_running", "queue", "allow_parallel"]},
                "concurrency_key": {"type": "string", "minLength": 1, "maxLength": 500},
                "max_concurrent": {"type": "integer", "minimum": 1, "maximum": 1000},
                "budget_cap_usd": {"type": "number", "minimum": 0},
                "autonomy": {"enum": ["A0", "A1", "A2", "A3", "A4"]},
                "approval_timeout_seconds": {"type": "integer", "minimum": 60, "maximum": 30 * 86400},
                "approval": _APPROVAL_NOTICES,
                "on_failure": {"type": "array", "maxItems": 10, "items": {"$ref": "#/$defs/step"}},
            },
        },
    },
}

_VALIDATOR = Draft202012Validator(DEFINITION_SCHEMA)


def _pointer(parts: Iterable[Any]) -> str:
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _issue(path: str, code: str, message: str) -> dict[str, str]:
    return {"path": path or "/", "code": code, "message": message}


def _schema_errors(validator: Draft202012Validator, instance: Any, base: str, *, lenient: bool) -> list[dict]:
    """Schema errors; with ``lenient`` a template string may stand where any scalar is expected."""
    issues = []
    for error in validator.iter_errors(instance):
        if lenient and isinstance(error.instance, str) and template.is_template(error.instance):
            continue
        issues.append(
            _issue(base + _pointer(error.absolute_path), "schema_violation", _schema_message(error))
        )
    return issues


def _schema_message(error) -> str:
    if error.validator == "required":
        return (
            error.message.replace("'", "", 2)
            if len(error.message) < 200
            else "a required property is missing"
        )
    if error.validator == "additionalProperties":
        return (
            "unknown property: "
            + ", ".join(sorted(set(error.instance) - set(error.schema.get("properties", {}))))[:200]
        )
    if error.validator in ("type", "enum", "const", "pattern", "minimum", "maximum", "minLength", "maxLength",
                           "minItems", "maxItems", "exclusiveMinimum"):  # fmt: skip
        return error.message[:300]
    return f"does not match the schema ({error.validator})"


def template_names(source: str) -> set[str]:
    """Top-level names a (valid) template reads: parsed and compiled only in the sandbox (SPEC §4)."""
    return set(template.template_names(source))


def action_of(step: Mapping[str, Any]) -> ActionDefinition | None:
    return registry.get_action(step.get("action", ""))


def describe_step(step: Mapping[str, Any], workspace_id: int | None = None) -> Capability | None:
    """The capability a step exercises, as far as its unrendered config tells."""
    action = registry.get_action(step.get("action", ""))
    if action is None:
        return None
    config = step.get("config") or {}
    if action.target is not None and workspace_id is not None:
        target = action.target(config, workspace_id)
        if target is not None:
            return target
    try:
        return action.describe(config)
    except Exception:  # a templated field the description depends on: assume the worst
        return Capability(
            id=step["action"],
            risk=Risk.HIGH,
            idempotent=False,
            side_effects=frozenset({SideEffect.EXTERNAL_WRITE}),
            expected_duration_seconds=60.0,
        )


def step_duration_seconds(step: Mapping[str, Any], workspace_id: int | None = None) -> float:
    if "expected_duration_seconds" in step:
        return float(step["expected_duration_seconds"])
    capability = describe_step(step, workspace_id)
    declared = capability.expected_duration_seconds if capability else 1.0
    return float(step.get("timeout_seconds", declared)) if "timeout_seconds" in step else declared


class _Checker:
    def __init__(self, definition: Mapping[str, Any], workspace_id: int | None, credential_names,
                 credential_grants: Mapping[str, Grant] | None, automation_id: Any):  # fmt: skip
        self.definition = definition
        self.workspace_id = workspace_id
        self.credential_names = credential_names
        self.credential_grants = credential_grants
        self.automation_id = automation_id
        self.issues: list[dict[str, str]] = []

    def add(self, path: str, code: str, message: str) -> None:
        self.issues.append(_issue(path, code, message))

    def check_template(self, source: str, path: str, known: set[str]) -> None:
        try:
            template.validate_template(source)
        except template.TemplateError as exc:
            self.add(path, exc.code, exc.message)
            return
        for name in sorted(template_names(source) - known):
            self.add(path, "undefined_reference", f"'{name}' is not defined at this point")

    def check_templates_in(self, value: Any, path: str, known: set[str]) -> None:
        for pointer, source in template.iter_templates(value):
            self.check_template(source, path + pointer, known)

    def check_steps(
        self, steps: list, base: str, known: set[str], seen_ids: set[str], final: bool
    ) -> set[str]:
        for i, step in enumerate(steps):
            path = f"{base}/{i}"
            step_id = step["step_id"]
            if step_id in seen_ids:
                self.add(path + "/step_id", "duplicate_step_id", f"step_id '{step_id}' is used twice")
            seen_ids.add(step_id)
            if "when" in step:
                self.check_template(step["when"], path + "/when", known)
            self.check_config(step, path, known)
            if "policy" in step:
                self.issues += rule_issues(step["policy"], path + "/policy")
            if "approval" in step:
                self.check_approval_notices(step["approval"], path + "/approval")
            name = step.get("output_as")
            if name:
                if name in RESERVED_NAMES:
                    self.add(path + "/output_as", "reserved_name", f"'{name}' is reserved")
                elif name in known and not final:
                    self.add(path + "/output_as", "duplicate_output", f"'{name}' is already bound")
                known = known | {name}
        return known

    def check_approval_notices(self, settings: Mapping[str, Any], path: str) -> None:
        """Recipients are e-mail addresses, ``role:<role>`` or usernames (notifications.services)."""
        for field in ("notify", "escalate_to"):
            if field in settings:
                try:
                    notices.check_targets(settings[field], f"{path}/{field}", usernames=True)
                except InvalidArgument as exc:
                    for error in exc.errors or ():
                        self.add(error["path"], "invalid_recipient", error["message"])
        if "remind_every_seconds" in settings and "remind_after_seconds" not in settings:
            self.add(
                path + "/remind_every_seconds",
                "missing_field",
                "remind_every_seconds needs remind_after_seconds",
            )

    def check_config(self, step: Mapping[str, Any], path: str, known: set[str]) -> None:
        action = registry.get_action(step["action"])
        if action is None:
            self.add(path + "/action", "unknown_action", f"unknown action '{step['action']}'")
            return
        config = step.get("config", {})
        before = len(self.issues)
        self.issues += _schema_errors(
            Draft202012Validator(action.config_schema), config, path + "/config", lenient=True
        )
        self.check_templates_in(config, path + "/config", known)
        if len(self.issues) == before and action.validate is not None:
            for suffix, code, message in action.validate(config):
                self.add(path + "/config" + suffix, code, message)
        self.check_credentials(action, config, path + "/config")
        if action.target is not None:
            self.check_capability_call(action, config, path + "/config")

    def check_credentials(self, action: ActionDefinition, config: Mapping[str, Any], path: str) -> None:
        if self.credential_names is None:
            return
        names = []
        if isinstance(config.get("credential"), str):
            names.append(("/credential", config["credential"]))
        for i, name in enumerate(config.get("credentials") or []):
            if isinstance(name, str):
                names.append((f"/credentials/{i}", name))
        for suffix, name in names:
            if not template.is_template(name) and name not in self.credential_names:
                self.add(
                    path + suffix, "unknown_credential", f"no credential named '{name}' in this workspace"
                )
            elif self.credential_grants is not None and name in self.credential_grants:
                self.check_grant(action, config, path + suffix, name, self.credential_grants[name])

    def check_grant(
        self, action: ActionDefinition, config: Mapping[str, Any], path: str, name: str, grant: Grant
    ) -> None:
        """What a literal reference shows breaks the credential's grants (the rest is checked at use)."""
        if self.automation_id is not None and not grant.allows_automation(self.automation_id):
            problem = "is not granted to this automation"
        elif self.automation_id is None and grant.allowed_automations is not None:
            problem = "is granted to listed automations only: create the automation, then have it granted"
        elif action.credentials_to_code and not grant.allow_code_steps:
            problem = "may not be given to code steps"
        elif (
            action.credential_destination is not None
            and isinstance(destination := action.credential_destination(config), str)
            and not template.is_template(destination)
            and not grant.allows_destination(destination)
        ):
            problem = "may not be sent to this URL (see the credential's allowed_destinations)"
        else:
            return
        self.add(path, "credential_not_granted", f"credential '{name}' {problem}")

    def check_capability_call(self, action: ActionDefinition, config: Mapping[str, Any], path: str) -> None:
        """An action that calls a capability (call_capability): that capability exists and takes these args."""
        capability_id = config.get("capability")
        if (
            not isinstance(capability_id, str)
            or template.is_template(capability_id)
            or self.workspace_id is None
        ):
            return
        capability = action.target(config, self.workspace_id) if action.target else None
        if capability is None:
            self.add(path + "/capability", "unknown_capability", f"unknown capability '{capability_id}'")
            return
        self.issues += _schema_errors(
            json_schema.validator(capability.input_schema),
            action.target_args(config) if action.target_args else config,
            path + "/args",
            lenient=True,
        )

    def check_inputs(self) -> None:
        schema = (self.definition.get("inputs") or {}).get("schema")
        if schema is None:
            return
        problem = json_schema.schema_problem(schema)
        if problem is not None:
            where, message = problem
            self.add("/inputs/schema" + where, "invalid_input_schema", f"not a valid JSON Schema: {message}")
            return
        for name, prop in (schema.get("properties") or {}).items():
            default = prop.get("default") if isinstance(prop, dict) else None
            if isinstance(default, str) and default.startswith("$") and default not in INPUT_DEFAULT_TOKENS:
                self.add(f"/inputs/schema/properties/{name}/default", "unknown_token",
                         f"unknown default token '{default}'")  # fmt: skip

    def check_triggers(self) -> None:
        seen: set[str] = set()
        for i, trigger in enumerate(self.definition.get("triggers") or []):
            path = f"/triggers/{i}"
            if trigger["key"] in seen:
                self.add(
                    path + "/key", "duplicate_trigger_key", f"trigger key '{trigger['key']}' is used twice"
                )
            seen.add(trigger["key"])
            config = trigger.get("config") or {}
            if trigger["type"] == "schedule":
                self.check_schedule(config, path + "/config")
            elif trigger["type"] == "event" and "filter" in config:
                for issue in validate_filter(config["filter"]):
                    self.add(path + "/config/filter" + issue.path, issue.code, issue.message)

    def check_schedule(self, config: Mapping[str, Any], path: str) -> None:
        tz_name = config.get("timezone", "UTC")
        try:
            zoneinfo.ZoneInfo(tz_name)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            self.add(path + "/timezone", "invalid_timezone", f"'{tz_name}' is not an IANA time zone")
        cron = config["cron"]
        if len(cron.split()) != 5 or not croniter.is_valid(cron):
            self.add(path + "/cron", "invalid_cron", "not a valid 5-field cron expression")
            return
        if min_cron_interval_seconds(cron) < MIN_SCHEDULE_INTERVAL_SECONDS:
            self.add(path + "/cron", "schedule_too_frequent", "schedules may fire at most once a minute")

    def check_execution(self) -> None:
        execution = self.definition.get("execution") or {}
        if "concurrency_key" in execution:
            self.check_template(
                execution["concurrency_key"], "/execution/concurrency_key", {"inputs", "trigger"}
            )


def min_cron_interval_seconds(cron: str) -> float:
    """Smallest gap between consecutive fires over a sample of upcoming slots."""
    it = croniter(cron, datetime(2030, 1, 1, tzinfo=UTC))
    previous = it.get_next(datetime)
    smallest = float("inf")
    for _ in range(5):
        current = it.get_next(datetime)
        smallest = min(smallest, (current - previous).total_seconds())
        previous = current
    return smallest


def validate_definition(
    definition: Any,
    *,
    workspace_id: int | None = None,
    credential_names: set[str] | None = None,
    credential_grants: Mapping[str, Grant] | None = None,
    automation_id: Any = None,
) -> list[dict[str, str]]:
    """Every problem with ``definition`` (schema first; semantics only once the shape is right)."""
    if not isinstance(definition, dict):
        return [_issue("/", "schema_violation", "a definition must be a JSON object")]
    if (size := definition_size(definition)) > MAX_DEFINITION_BYTES:
        return [
            _issue(
                "/",
                "too_large",
                f"the definition is {size // 1024} KB; at most {MAX_DEFINITION_BYTES // 1024} KB",
            )
        ]
    issues = _schema_errors(_VALIDATOR, definition, "", lenient=False)
    if issues:
        return issues
    checker = _Checker(definition, workspace_id, credential_names, credential_grants, automation_id)
    checker.check_inputs()
    checker.check_triggers()
    base_names = {"inputs", "trigger", "run", "event"}
    seen_ids: set[str] = set()
    known = checker.check_steps(definition["plan"], "/plan", base_names, seen_ids, final=False)
    on_failure = (definition.get("execution") or {}).get("on_failure") or []
    checker.check_steps(on_failure, "/execution/on_failure", known, seen_ids, final=True)
    checker.check_execution()
    approval = (definition.get("execution") or {}).get("approval")
    if approval is not None:
        checker.check_approval_notices(approval, "/execution/approval")
    return checker.issues


def step_config_issues(
    step: Mapping[str, Any],
    *,
    workspace_id: int,
    credential_names: set[str],
    credential_grants: Mapping[str, Grant],
    automation_id: Any,
) -> list[dict[str, str]]:
    """The checks a save runs on one step's config (schema, templates, the action's own checks,
    credentials and their grants, the capability it calls): for an approver's edit of it."""
    checker = _Checker({}, workspace_id, credential_names, credential_grants, automation_id)
    checker.check_config(step, "", set())
    return checker.issues


def definition_size(definition: Any) -> int:
    """Bytes of ``definition`` as compact UTF-8 JSON (more than the cap when it cannot be encoded)."""
    try:
        return len(json.dumps(definition, separators=(",", ":"), ensure_ascii=False).encode(errors="replace"))
    except (TypeError, ValueError, RecursionError):
        return MAX_DEFINITION_BYTES + 1


def definition_json_schema() -> dict[str, Any]:
    return DEFINITION_SCHEMA


def filter_json_schema() -> dict[str, Any]:
    return FILTER_SCHEMA
