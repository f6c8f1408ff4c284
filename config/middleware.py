"""Answers 404/500 on API paths with JSON, never Django's HTML pages."""

from __future__ import annotations

import json
import logging

from django.http import HttpResponse

logger = logging.getLogger(__name__)

_JSON_PREFIXES = ("/api/", "/healthz")


def _json(status: int, code: str, message: str) -> HttpResponse:
    body = json.dumps({"error": {"code": code, "message": message}})
    return HttpResponse(body, status=status, content_type="application/json")


class JsonErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith(_JSON_PREFIXES) and response.status_code in (404, 500):
            if not response.get("Content-Type", "").startswith("application/json"):
                code = "NOT_FOUND" if response.status_code == 404 else "INTERNAL"
                return _json(response.status_code, code, code.lower().replace("_", " "))
        return response

    def process_exception(self, request, exception):
        if request.path.startswith(_JSON_PREFIXES):
            logger.exception("unhandled error on %s", request.path, exc_info=exception)
            return _json(500, "INTERNAL", "internal error")
        return None
