"""Admin changelists over tables that grow with history (runs, steps, audit, events).

Django's changelist counts its rows twice per page (``COUNT(*)`` of the filtered rows and
of the whole table); over a million runs each count is a full scan. Here the filtered
count is exact up to ``EXACT_UP_TO`` rows, read with a ``LIMIT`` so it stops early, and
past that it is the planner's estimate (``EXPLAIN``, never executed; PostgreSQL only),
shown as a round number; where the planner expects far more rows than that, nothing is
counted at all. ``HistoryAdminMixin`` turns off the whole-table count too.

Pages stop at ``MAX_PAGES``: page N is an OFFSET, which reads every key above it, so
the newest ``MAX_PAGES`` pages of a list are offered and older rows are reached by
narrowing it (a filter, a search), as the changelist then says.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any, cast

from django.contrib import messages
from django.core.exceptions import FieldDoesNotExist
from django.core.paginator import EmptyPage, Paginator
from django.db import connections
from django.db.models import Q, QuerySet

EXACT_UP_TO = 1000
MAX_PAGES = 20


def planner_estimate(queryset) -> int | None:
    """The planner's row estimate for ``queryset`` (no rows read), or None off PostgreSQL."""
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    sql, params = queryset.order_by().values("pk").query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def _rounded(estimate: int) -> int:
    """Two significant digits, so nobody reads an estimate as exact."""
    return int(float(f"{estimate:.2g}"))


def keyset_order(queryset) -> tuple[str, ...] | None:
    """The queryset's ordering as a keyset (``("-created_at", "-id")``), or None where it is not
    one: each key a column of the model itself that cannot be NULL, ending in a unique one."""
    if queryset.query.extra_order_by or not queryset.query.order_by:
        return None
    keys = []
    for key in queryset.query.order_by:
        if not isinstance(key, str) or key == "?":
            return None
        name = key.lstrip("-")
        if "__" in name or key.count("-") > 1:
            return None
        try:
            field = queryset.model._meta.pk if name == "pk" else queryset.model._meta.get_field(name)
        except FieldDoesNotExist:
            return None
        if not getattr(field, "concrete", False) or field.null or field.is_relation:
            return None
        keys.append(key)
        if field.primary_key or field.unique:
            return tuple(keys)
    return None  # no unique key: ties would make pages overlap


def at_or_after(keys: tuple[str, ...], values) -> Q:
    """Rows at or after ``values`` in the order ``keys``: ``a <= va AND (a < va OR (a = va AND
    b <= vb))`` for two descending keys. The first conjunct is a range on the index's leading
    column, so the scan starts at the key instead of filtering its way there."""
    ops = [(key.lstrip("-"), "lt" if key.startswith("-") else "gt") for key in keys]
    condition = Q(**{f"{ops[-1][0]}__{ops[-1][1]}e": values[-1]})
    for (name, op), value in zip(reversed(ops[:-1]), reversed(values[:-1]), strict=True):
        condition = Q(**{f"{name}__{op}": value}) | (Q(**{name: value}) & condition)
    name, op = ops[0]
    return Q(**{f"{name}__{op}e": values[0]}) & condition if len(keys) > 1 else condition


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        rows = cast("QuerySet[Any]", self.object_list)  # the admin changelist always pages a queryset
        estimate = planner_estimate(rows)
        # Far past the exact limit, counting even 1,001 matching rows of a rare filter can
        # mean visiting many thousands: the estimate alone says enough.
        if estimate is not None and estimate > 20 * EXACT_UP_TO:
            return _rounded(estimate)
        counted = len(rows.order_by().values_list("pk", flat=True)[: EXACT_UP_TO + 1])
        if counted <= EXACT_UP_TO:
            return counted
        return max(_rounded(estimate or 0), counted)

    @cached_property
    def num_pages(self) -> int:
        return min(Paginator.num_pages.func(self), MAX_PAGES)  # type: ignore[attr-defined]

    @property
    def capped(self) -> bool:
        """Whether rows lie beyond the last page offered."""
        return self.count > MAX_PAGES * self.per_page

    def page(self, number):
        """Past the first page, the key of the page's first row (an index-only OFFSET), then the
        page's rows from that key on in index order, as page 1 reads them. Where the order is
        not a keyset (a column that can be NULL, or through a relation), the page's keys, then
        its rows by key. An OFFSET over whole rows would read, and join, every row above it."""
        number = self.validate_number(number)
        bottom = (number - 1) * self.per_page
        if bottom == 0 or not hasattr(self.object_list, "values_list"):
            return super().page(number)
        queryset = cast("QuerySet[Any]", self.object_list)
        keys = keyset_order(queryset)
        if keys is not None:
            names = [key.lstrip("-") for key in keys]
            first = list(queryset.values_list(*names)[bottom : bottom + 1])
            rows = list(queryset.filter(at_or_after(keys, first[0]))[: self.per_page]) if first else []
            # Paginator._get_page is Django's hook for the Page class; django-stubs leave it out.
            return self._get_page(rows, number, self)  # type: ignore[attr-defined]
        pks = list(queryset.values_list("pk", flat=True)[bottom : bottom + self.per_page])
        by_pk = {row.pk: row for row in queryset.filter(pk__in=pks)}
        return self._get_page([by_pk[pk] for pk in pks if pk in by_pk], number, self)  # type: ignore[attr-defined]

    def validate_number(self, number):
        try:
            return super().validate_number(number)
        except EmptyPage:
            if int(number) > 1 and self.capped:
                return self.num_pages  # a deeper page asked for (an old link): the deepest offered
            raise


class HistoryAdminMixin:
    """For a ModelAdmin over a big table: no full COUNT(*), no date drill-down."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    date_hierarchy = None
    list_per_page = 50

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)  # type: ignore[misc]
        changelist = (getattr(response, "context_data", None) or {}).get("cl")
        if changelist is not None and getattr(changelist.paginator, "capped", False):
            messages.info(request, f"Only the first {MAX_PAGES * self.list_per_page:,} rows are paged: "
                                   "narrow the list with a filter or a search to reach the others.")  # fmt: skip
        return response
