"""The one pagination of the API's lists: ``{"count", "next", "previous", "results"}``.

DRF's page-number pagination, except that a page that is not a number (``?page=``,
``?page=abc``) is a 400 with the envelope, not silently page 1 or a 404.
"""

from __future__ import annotations

from rest_framework import pagination
from rest_framework.exceptions import ValidationError


class PageNumberPagination(pagination.PageNumberPagination):
    invalid_page_message = "page {page_number} does not exist"

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param)
        if raw is None or raw in self.last_page_strings:
            return super().get_page_number(request, paginator)
        if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
            raise ValidationError({self.page_query_param: ["must be a page number: 1, 2, ..."]})
        return raw
