"""Answers 404/500 on API paths with JSON, never Django's HTML pages."""

from __future__ import annotations

import logging

from .api_errors import NOT_FOUND_MESSAGE, json_error

logger = logging.getLogger(__name__)

_JSON_PREFIXES = ("/api/", "/healthz")


class JsonErrorMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.path.startswith(_JSON_PREFIXES) and response.status_code in (404, 500):
            if not response.get("Content-Type", "").startswith("application/json"):
                code = "NOT_FOUND" if response.status_code == 404 else "INTERNAL"
                message = NOT_FOUND_MESSAGE if response.status_code == 404 else "internal error"
                return json_error(response.status_code, code, message)
        return response

    def process_exception(self, request, exception):
        if request.path.startswith(_JSON_PREFIXES):
            logger.exception("unhandled error on %s", request.path, exc_info=exception)
            return json_error(500, "INTERNAL", "internal error")
        return None
