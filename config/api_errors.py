"""Every API error is JSON in one of two shapes (SPEC §11):
``{"error": {"code", "message"}}`` or ``{"errors": [{"path", "code", "message"}]}``.

This handler is the one place a :class:`~config.errors.ServiceError` becomes a
response: views call services and let their errors through, untranslated.

A database that cannot be reached (down, restarting, connections killed) is a
503 ``UNAVAILABLE`` with ``Retry-After``, never a 500: the request's transaction
did not commit, so nothing was created and the client may simply send it again
(with the same ``Idempotency-Key``).
"""

from __future__ import annotations

import json
import logging

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from .errors import ServiceError

logger = logging.getLogger(__name__)

DATABASE_RETRY_AFTER_SECONDS = 5


_CODES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "UNPROCESSABLE",
    429: "RATE_LIMITED",
}


NOT_FOUND_MESSAGE = "not found"


def error_body(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def json_error(status_code: int, code: str, message: str, headers=None) -> HttpResponse:
    """An error response outside DRF, byte for byte what DRF's JSONRenderer writes for it."""
    body = json.dumps(error_body(code, message), separators=(",", ":"), ensure_ascii=False).encode()
    response = HttpResponse(body, status=status_code, content_type="application/json")
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _flatten(detail, path: str = "") -> list[dict]:
    if isinstance(detail, dict):
        out: list[dict] = []
        for key, value in detail.items():
            sub = "" if key == "non_field_errors" else f"{path}/{key}"
            out.extend(_flatten(value, sub))
        return out
    if isinstance(detail, list):
        if all(isinstance(d, exceptions.ErrorDetail | str) for d in detail):
            return [{"path": path or "/", "code": "INVALID_ARGUMENT", "message": str(d)} for d in detail]
        out = []
        for i, value in enumerate(detail):
            out.extend(_flatten(value, f"{path}/{i}"))
        return out
    return [{"path": path or "/", "code": "INVALID_ARGUMENT", "message": str(detail)}]


def service_error_response(exc: ServiceError) -> HttpResponse:
    if exc.errors:
        return Response({"errors": exc.errors}, status=exc.http_status, headers=exc.headers)
    if exc.http_status == 401:
        # Built from the code and message alone, so that every 401 with the same
        # message is identical byte for byte, whatever caused it (no oracle).
        return json_error(401, exc.code, exc.message, exc.headers)
    return Response(error_body(exc.code, exc.message), status=exc.http_status, headers=exc.headers)


def exception_handler(exc, context):
    if isinstance(exc, ServiceError):
        return service_error_response(exc)
    if isinstance(exc, RequestDataTooBig):  # read past DATA_UPLOAD_MAX_MEMORY_SIZE (no Content-Length)
        return Response(error_body("PAYLOAD_TOO_LARGE", "the body is too large"), status=413)
    if isinstance(exc, OperationalError | InterfaceError):
        logger.warning("API request refused: the database is unavailable (%s)", type(exc).__name__)
        return Response(
            error_body(
                "TEMPORARILY_UNAVAILABLE", "the database is unavailable; nothing was done, retry later"
            ),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_SECONDS)},
        )
    if isinstance(exc, Http404) or (
        isinstance(exc, exceptions.NotFound) and exc.detail == exceptions.NotFound.default_detail
    ):
        exc = exceptions.NotFound(NOT_FOUND_MESSAGE)
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.ValidationError):
        return Response({"errors": _flatten(exc.detail)}, status=400)
    response = drf_exception_handler(exc, context)
    if response is None:
        logger.exception("unhandled API error", exc_info=exc)
        return Response(
            error_body("INTERNAL", "internal error"), status=status.HTTP_500_INTERNAL_SERVER_ERROR
        )
    code = _CODES.get(response.status_code, "ERROR")
    message = str(getattr(exc, "detail", "")) or code.lower()
    response.data = error_body(code, message)
    return response
