"""The API's two paginations.

``PageNumberPagination`` (``{"count", "next", "previous", "results"}``) for the small
lists (automations, triggers, approvals, credentials): DRF's, except that a page that is
not a number (``?page=``, ``?page=abc``) is a 400 with the envelope, not silently page 1
or a 404.

``KeysetPagination`` (``{"next", "previous", "results"}``) for the lists that grow with
history (runs, audit). A page is a ``WHERE (key) < (last key seen) ORDER BY key LIMIT n``
on an index: no ``COUNT(*)`` and no ``OFFSET``, so page 1 000 costs what page 1 costs, and
rows inserted meanwhile neither shift nor repeat a page. The cursor is the last key seen,
signed, so a cursor that was not handed out by us is a 400, never a query.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.core import signing
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Q
from rest_framework import pagination
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response


class PageNumberPagination(pagination.PageNumberPagination):
    invalid_page_message = "page {page_number} does not exist"

    def get_page_number(self, request, paginator):
        raw = request.query_params.get(self.page_query_param)
        if raw is None or raw in self.last_page_strings:
            return super().get_page_number(request, paginator)
        if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
            raise ValidationError({self.page_query_param: ["must be a page number: 1, 2, ..."]})
        return raw


_CURSOR_SALT = "autoplane.api.cursor"
_BAD_CURSOR = "not a cursor of this list: follow the next or previous link as it was given"


def cursor_token(values: list, *, backwards: bool = False) -> str:
    """The ``?cursor=`` that starts a page after (or, backwards, before) the row with ``values``."""
    return signing.dumps({"k": values, "b": backwards}, salt=_CURSOR_SALT, compress=False)


def keyset_after(keys: tuple[str, ...], values: list, *, backwards: bool = False) -> Q:
    """Rows strictly after ``values`` in the order ``keys`` (e.g. ``("-created_at", "-id")``).

    For two keys it is ``a <= va AND (a < va OR b < vb)`` (for descending keys): the first
    conjunct is a plain range on the index's leading column, so the planner starts the scan
    at the cursor instead of filtering its way there; the second only settles ties.
    """
    conditions = []
    for key in keys:
        descending = key.startswith("-")
        conditions.append((key.lstrip("-"), "lt" if descending != backwards else "gt"))
    (first, op), value = conditions[0], values[0]
    if len(conditions) == 1:
        return Q(**{f"{first}__{op}": value})
    (second, op2), value2 = conditions[1], values[1]
    return Q(**{f"{first}__{op}e": value}) & (
        Q(**{f"{first}__{op}": value}) | Q(**{f"{second}__{op2}": value2})
    )


class KeysetPagination(pagination.BasePagination):
    """Cursor pagination on a unique key (``ordering``; the last field must be unique)."""

    ordering: tuple[str, ...] = ("-id",)
    page_size = 50
    cursor_query_param = "cursor"

    def paginate_queryset(self, queryset, request, view=None):
        self.request = request
        page = request.query_params.get("page")
        if page not in (None, "1"):
            raise ValidationError({"page": ["this list is paged by cursor: follow the next link"]})
        position, backwards = self._decode(request.query_params.get(self.cursor_query_param), queryset.model)
        ordering = self._reversed() if backwards else self.ordering
        rows = queryset.order_by(*ordering)
        if position is not None:
            rows = rows.filter(keyset_after(self.ordering, position, backwards=backwards))
        page_rows = list(rows[: self.page_size + 1])
        more = len(page_rows) > self.page_size
        page_rows = page_rows[: self.page_size]
        if backwards:
            page_rows.reverse()
        # Going forwards there is a previous page when we came from a cursor, and a next one
        # when more rows were found; going backwards, the other way round.
        has_next = (not backwards and more) or (backwards and position is not None)
        has_previous = (backwards and more) or (not backwards and position is not None)
        self.next = self._link(page_rows[-1], False) if has_next and page_rows else None
        self.previous = self._link(page_rows[0], True) if has_previous and page_rows else None
        return page_rows

    def get_paginated_response(self, data):
        return Response({"next": self.next, "previous": self.previous, "results": data})

    def get_paginated_response_schema(self, schema):
        link = {"type": "string", "nullable": True, "format": "uri"}
        return {
            "type": "object",
            "required": ["next", "previous", "results"],
            "properties": {"next": link, "previous": link, "results": schema},
        }

    def get_schema_operation_parameters(self, view):
        return [
            {
                "name": self.cursor_query_param,
                "required": False,
                "in": "query",
                "description": "where the page starts: the `next` or `previous` link of the page before",
                "schema": {"type": "string"},
            }
        ]

    def _reversed(self) -> tuple[str, ...]:
        return tuple(key[1:] if key.startswith("-") else f"-{key}" for key in self.ordering)

    def _fields(self) -> list[str]:
        return [key.lstrip("-") for key in self.ordering]

    def _link(self, row, backwards: bool) -> str:
        values = [
            value if isinstance(value, int) else str(value)
            for value in (getattr(row, f) for f in self._fields())
        ]
        token = cursor_token(values, backwards=backwards)
        params = {
            k: v for k, v in self.request.query_params.items() if k not in (self.cursor_query_param, "page")
        }
        params[self.cursor_query_param] = token
        return self.request.build_absolute_uri(f"{self.request.path}?{urlencode(params)}")

    def _decode(self, raw: str | None, model) -> tuple[list | None, bool]:
        if raw is None:
            return None, False
        try:
            data = signing.loads(raw, salt=_CURSOR_SALT)
            values, backwards = data["k"], data["b"]
            fields = self._fields()
            if not (isinstance(values, list) and len(values) == len(fields) and isinstance(backwards, bool)):
                raise ValueError
            position = [model._meta.get_field(f).to_python(v) for f, v in zip(fields, values, strict=True)]
            if any(v is None for v in position):
                raise ValueError
        except (signing.BadSignature, KeyError, TypeError, ValueError, DjangoValidationError):
            raise ValidationError({self.cursor_query_param: [_BAD_CURSOR]}) from None
        return position, backwards


class RunPagination(KeysetPagination):
    ordering = ("-created_at", "-id")


class AuditPagination(KeysetPagination):
    ordering = ("id",)
