"""Admin changelists over tables that grow with history (runs, steps, audit, events).

Django's changelist counts its rows twice per page (``COUNT(*)`` of the filtered rows and
of the whole table); over a million runs each count is a full scan. Here the filtered
count is exact up to ``EXACT_UP_TO`` rows, read with a ``LIMIT`` so it stops early, and
past that it is the planner's estimate (``EXPLAIN``, never executed; PostgreSQL only),
shown as a round number; where the planner expects far more rows than that, nothing is
counted at all. ``HistoryAdminMixin`` turns off the whole-table count too.
"""

from __future__ import annotations

import json
from functools import cached_property

from django.core.paginator import Paginator
from django.db import connections

EXACT_UP_TO = 1000


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


class EstimatedCountPaginator(Paginator):
    @cached_property
    def count(self) -> int:
        rows = self.object_list
        estimate = planner_estimate(rows)
        # Far past the exact limit, counting even 1,001 matching rows of a rare filter can
        # mean visiting many thousands: the estimate alone says enough.
        if estimate is not None and estimate > 20 * EXACT_UP_TO:
            return _rounded(estimate)
        counted = len(rows.order_by().values_list("pk", flat=True)[: EXACT_UP_TO + 1])
        if counted <= EXACT_UP_TO:
            return counted
        return max(_rounded(estimate or 0), counted)


class HistoryAdminMixin:
    """For a ModelAdmin over a big table: no full COUNT(*), no date drill-down."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    date_hierarchy = None
    list_per_page = 50
