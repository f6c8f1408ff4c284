"""``wait``: delay N seconds or until a time, without holding a worker.

The handler never sleeps: it returns a successful envelope with ``resume_at``
and the executor parks the run until then.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..base import ActionContext, ActionDefinition, Capability, Envelope, ErrorCode, Risk, StepFailure

MAX_SECONDS = 30 * 24 * 3600

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "seconds": {"type": "number", "minimum": 0, "maximum": MAX_SECONDS},
        "until": {"type": "string", "minLength": 10, "maxLength": 64},
    },
    "oneOf": [{"required": ["seconds"]}, {"required": ["until"]}],
}

PROFILE = Capability(id="wait", risk=Risk.LOW, idempotent=True, expected_duration_seconds=0.01)


def describe(config: Mapping[str, Any]) -> Capability:
    return PROFILE


def parse_until(value: str) -> datetime:
    """An ISO 8601 datetime with an explicit offset (a naive time would depend on the server's zone)."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("until must be an ISO 8601 datetime, e.g. 2030-01-31T09:00:00Z")
    if moment.tzinfo is None:
        raise ValueError("until must include a timezone offset, e.g. 'Z' or '+02:00'")
    return moment


def validate(config: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    until = config.get("until")
    if not isinstance(until, str) or "{{" in until or "{%" in until:
        return []
    try:
        parse_until(until)
    except ValueError as exc:
        return [("/until", "invalid_datetime", str(exc))]
    return []


def handler(ctx: ActionContext, config: Mapping[str, Any]) -> Envelope:
    now = datetime.now(UTC)
    if "until" in config:
        try:
            resume_at = max(parse_until(config["until"]).astimezone(UTC), now)
        except ValueError as exc:
            raise StepFailure(ErrorCode.INVALID_ARGUMENT, str(exc))
    else:
        resume_at = now + timedelta(seconds=float(config["seconds"]))
    return Envelope(
        ok=True,
        summary=f"waiting until {resume_at.isoformat()}",
        data={"resume_at": resume_at.isoformat()},
        resume_at=resume_at,
    )


ACTION = ActionDefinition(
    name="wait",
    description="Delay the run for N seconds or until a time (the run is parked; no worker is held).",
    config_schema=CONFIG_SCHEMA,
    describe=describe,
    handler=handler,
    validate=validate,
)
