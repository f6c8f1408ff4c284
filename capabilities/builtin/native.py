"""Native capabilities, callable through ``call_capability`` and by agents."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..base import ActionContext, Capability, Envelope, Risk, SideEffect
from . import http_request


def _echo(ctx: ActionContext, args: Mapping[str, Any]) -> Envelope:
    return Envelope.success(dict(args), summary="echoed")


ECHO = Capability(
    id="core.echo",
    description="Return the arguments unchanged.",
    input_schema={"type": "object"},
    output_schema={"type": "object"},
    risk=Risk.LOW,
    idempotent=True,
    expected_duration_seconds=0.01,
    handler=_echo,
)


def _http_get(ctx: ActionContext, args: Mapping[str, Any]) -> Envelope:
    return http_request.perform_request(
        ctx,
        method="GET",
        url=args["url"],
        headers=args.get("headers") or {},
        params=args.get("params") or {},
        timeout=float(args.get("timeout_seconds", http_request.DEFAULT_TIMEOUT_SECONDS)),
    )


# Deliberately no ``credential`` argument: a model choosing both the URL and a
# credential could send that credential anywhere. Authenticated calls go
# through an ``http_request`` step, whose URL a human wrote.
HTTP_GET = Capability(
    id="core.http_get",
    description="HTTP GET a public URL (SSRF-guarded); JSON responses are parsed, bodies capped at 1 MB.",
    input_schema={
        "type": "object",
        "required": ["url"],
        "additionalProperties": False,
        "properties": {
            "url": {"type": "string", "pattern": "^[Hh][Tt][Tt][Pp][Ss]?://", "maxLength": 8192},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}},
            "params": {"type": "object", "additionalProperties": {"type": "string"}},
            "timeout_seconds": {
                "type": "number",
                "exclusiveMinimum": 0,
                "maximum": http_request.MAX_TIMEOUT_SECONDS,
            },
        },
    },
    output_schema={
        "type": "object",
        "properties": {
            "status": {"type": "integer"},
            "headers": {"type": "object"},
            "body": {},
            "truncated": {"type": "boolean"},
        },
    },
    side_effects=frozenset({SideEffect.READ}),
    risk=Risk.LOW,
    idempotent=True,
    expected_duration_seconds=http_request.DEFAULT_TIMEOUT_SECONDS,
    handler=_http_get,
)
