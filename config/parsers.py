"""The API's only request parser: strict JSON (see :mod:`config.strict_json`).

Every other media type is a 415 (DRF raises it when a view reads ``request.data``; the
API edge middleware refuses a non-JSON body before any view runs).
"""

from __future__ import annotations

from typing import Any

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from . import strict_json


class StrictJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None) -> Any:
        request = (parser_context or {}).get("request")
        django_request = getattr(request, "_request", None)
        # parsed (and checked) by the API edge middleware
        if django_request is not None and hasattr(django_request, "strict_json"):
            return django_request.strict_json
        raw = stream.read() if stream is not None else b""
        try:
            return strict_json.loads(raw, what="the request body")
        except strict_json.BodyInvalid as exc:
            raise ParseError(str(exc)) from None
