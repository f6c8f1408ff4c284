"""The API's edge: bodies it refuses before any view runs, and JSON for every error.

On ``/api/`` (and ``/healthz``):

- a write (POST/PUT/PATCH/DELETE) with a body must be ``application/json`` (or ``+json``)
  and not content-encoded → else 415; its ``Content-Length`` must not pass
  ``DATA_UPLOAD_MAX_MEMORY_SIZE`` → else 413; and it must be strict JSON
  (:mod:`config.strict_json`: depth, duplicate keys, lone surrogates...) → else 400, whether
  or not the view reads it. The parsed value is kept on the request for the API's parser
  (:mod:`config.parsers`), so a body is parsed once. The webhook ``/fire`` endpoint checks
  its own (stricter, and only after authentication) and the one-click approval page takes
  its HTML form;
- an error response that is not JSON (Django's own 400 for a disallowed ``Host``, a 404
  or 500 page, ...) is replaced by the error envelope with the same status;
- an exception a view lets through is a JSON 500 (a body too large to read, a 413).

This middleware comes first, so that it also sees what the middleware after it answers.
"""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse

from . import instruments, strict_json
from .api_errors import _CODES, NOT_FOUND_MESSAGE, json_error

logger = logging.getLogger(__name__)

_JSON_PREFIXES = ("/api/", "/healthz")
_HTML_PREFIXES = ("/api/v1/approvals/link/", "/api/docs/")  # pages for a browser
_WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_MESSAGES = {404: NOT_FOUND_MESSAGE, 500: "internal error", 400: "bad request"}


def _is_json_media(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def body_refusal(request):
    """The 413/415 answer for a write whose body the API will not read, or None."""
    meta = request.META
    if (meta.get("HTTP_CONTENT_ENCODING") or "identity").strip().lower() != "identity":
        return json_error(415, "UNSUPPORTED_MEDIA_TYPE", "no content encoding is supported (send plain JSON)")
    length_text = (meta.get("CONTENT_LENGTH") or "").strip()
    length = int(length_text) if length_text.isdigit() else 0
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        return json_error(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {limit} bytes")
    has_body = length > 0 or "HTTP_TRANSFER_ENCODING" in meta
    if not has_body:
        return None
    if not _is_json_media(meta.get("CONTENT_TYPE") or ""):
        return json_error(415, "UNSUPPORTED_MEDIA_TYPE", "the API speaks JSON only: send application/json")
    try:
        raw = request.body
    except RequestDataTooBig:
        return json_error(413, "PAYLOAD_TOO_LARGE", f"the body is larger than {limit} bytes")
    if raw:
        try:
            request.strict_json = strict_json.loads(raw, what="the request body")
        except strict_json.BodyInvalid as exc:
            return JsonResponse({"errors": [{"path": "/", "code": "INVALID_ARGUMENT", "message": str(exc)}]},
                                status=400)  # fmt: skip
    return None


class JsonErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        path = request.path
        on_api = path.startswith(_JSON_PREFIXES) and not path.startswith(_HTML_PREFIXES)
        # /healthz takes no body (a write there is 405 from its view): only /api/ writes are read here.
        reads_body = path.startswith("/api/") and not path.endswith("/fire")
        if on_api and reads_body and request.method in _WRITE_METHODS:
            refused = body_refusal(request)
            if refused is not None:
                return refused
        response = self.get_response(request)
        if on_api and response.status_code >= 400:
            if not response.get("Content-Type", "").startswith("application/json"):
                status = response.status_code
                code = _CODES.get(status, "INTERNAL" if status >= 500 else "INVALID_ARGUMENT")
                return json_error(status, code, _MESSAGES.get(status, code.lower().replace("_", " ")))
        return response

    def process_exception(self, request, exception):
        if request.path.startswith(_JSON_PREFIXES):
            if isinstance(exception, RequestDataTooBig):
                return json_error(413, "PAYLOAD_TOO_LARGE", "the body is too large")
            logger.exception("unhandled error on %s", request.path, exc_info=exception)
            return json_error(500, "INTERNAL", "internal error")
        return None


class RequestMetricsMiddleware:
    """Counts each request and its duration by method, route and status class (config.instruments).

    The route is the URL pattern (``api/v1/runs/<uuid:pk>``), never the path, so ids do not
    become series; a request no pattern matched is ``unmatched``.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        match = getattr(request, "resolver_match", None)
        route = match.route if match is not None and match.route else "unmatched"
        instruments.http_request(method=request.method if request.method in _METHODS else "other", route=route,
                                 status=response.status_code, seconds=time.perf_counter() - started)  # fmt: skip
        return response
