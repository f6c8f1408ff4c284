"""The OpenAPI description of the API (``/api/schema/``), kept true to what it answers.

The error envelope (SPEC §11) is described once, as the ``Error`` component, and every
operation's error responses reference it. :class:`AutoSchema` adds the errors an
operation can answer because of how it is reached, so that no view has to list them:

* 400 when it takes a body or query parameters;
* 401 when it needs a caller, and 403 when that caller writes (role, CSRF);
* 404 when its path names an object, or it is a paginated list (a page past the end);
* 413 and 415 when it takes a body (JSON only, bounded in size);
* 503 when it needs a caller (and so the database): nothing was done, retry later.

Views add what their services can refuse beyond that (409, 422, 429, 502) with
:func:`errors`, e.g. ``responses={202: RunAccepted, **errors(409, 422)}``.
"""

from __future__ import annotations

from drf_spectacular import openapi
from drf_spectacular.utils import OpenApiResponse, PolymorphicProxySerializer
from rest_framework import permissions, serializers

_DESCRIPTIONS = {
    400: 'Invalid request: `{"errors": [{path, code, message}]}` for input problems, '
    'otherwise `{"error": {code, message}}`',
    401: "No valid credentials (`UNAUTHENTICATED`)",
    403: "Your role in the workspace does not allow this (`PERMISSION_DENIED`)",
    404: "No such object in your workspaces (`NOT_FOUND`)",
    409: "The object's state does not allow this now (`CONFLICT` and similar codes)",
    410: "The automation is archived (`GONE`)",
    413: "The request body is too large (`PAYLOAD_TOO_LARGE`)",
    415: "The body is not JSON (`UNSUPPORTED_MEDIA_TYPE`)",
    422: "Well-formed but refused (`UNPROCESSABLE`, `BUDGET_EXCEEDED`)",
    429: "Too many requests (`RATE_LIMITED`; for a webhook, `TOO_MANY_FAILURES` after failed "
    "authentications); see `Retry-After`",
    502: "An upstream server (an MCP server, the LLM) failed or answered something unusable",
    503: "A dependency (the database; for drafts, the LLM) is unavailable: nothing was done; "
    "see `Retry-After`",
}
# Answered by the web server (gunicorn) before the application sees the request, so it is
# not the envelope: plain text from gunicorn's ASGI worker (what `up` and compose run), HTML
# from its synchronous workers.
_URI_TOO_LONG = {
    "description": "The request line is longer than the web server accepts (4094 bytes)",
    "content": {"text/plain": {"schema": {"type": "string"}}, "text/html": {"schema": {"type": "string"}}},
}
_WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class ErrorDetail(serializers.Serializer):
    code = serializers.CharField(help_text="stable, upper-case: NOT_FOUND, CONFLICT, ...")
    message = serializers.CharField(help_text="safe to show a user")


class ErrorEnvelope(serializers.Serializer):
    error = ErrorDetail()


class FieldError(serializers.Serializer):
    path = serializers.CharField(help_text="JSON pointer into the request, / for the whole of it")
    code = serializers.CharField()
    message = serializers.CharField()


# Built with type(): a field declared as a class attribute named ``errors`` would shadow
# ``Serializer.errors``.
ValidationErrorEnvelope = type(
    "ValidationErrorEnvelope", (serializers.Serializer,), {"errors": FieldError(many=True)}
)


ERROR = PolymorphicProxySerializer(
    component_name="Error",
    serializers=[ErrorEnvelope, ValidationErrorEnvelope],
    resource_type_field_name=None,
    many=False,
)


def error_response(status: int) -> OpenApiResponse:
    return OpenApiResponse(ERROR, description=_DESCRIPTIONS.get(status, "Error"))


def errors(*statuses: int) -> dict[int, OpenApiResponse]:
    """Error responses for ``extend_schema(responses=...)``, all referencing ``Error``."""
    return {status: error_response(status) for status in statuses}


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        for status in self._implied_errors(operation):
            if str(status) not in responses:
                responses[str(status)] = self._get_response_for_code(error_response(status), str(status))
        if operation.get("parameters") and "414" not in responses:
            responses["414"] = _URI_TOO_LONG
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _implied_errors(self, operation: dict) -> list[int]:
        implied = []
        in_query = any(p.get("in") == "query" for p in operation.get("parameters", []))
        if self.method in _BODY_METHODS or in_query:
            implied.append(400)
        if self._needs_caller():
            implied.append(401)
            if self.method in _WRITE_METHODS:
                implied.append(403)
            implied.append(503)  # the database is unreachable: nothing was done, retry later
        if "{" in self.path or any(p.get("name") == "page" for p in operation.get("parameters", [])):
            implied.append(404)
        if self.method in _BODY_METHODS:
            implied += [413, 415]
        return implied

    def _needs_caller(self) -> bool:
        return not any(isinstance(p, permissions.AllowAny) for p in self.view.get_permissions())
