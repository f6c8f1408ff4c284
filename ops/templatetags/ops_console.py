"""``{% needs_me_panel %}``: the admin home page's "Needs you" panel."""

from __future__ import annotations

from django import template
from django.urls import reverse

from approvals.admin import what_summary
from automations.admin import coloured_status, error_text
from ops.console import needs_me, needs_me_details

register = template.Library()


@register.inclusion_tag("admin/ops/needs_me.html", takes_context=True)
def needs_me_panel(context):
    counts = needs_me(context["request"].user)
    runs = reverse("admin:automations_run_changelist")
    details = needs_me_details(context["request"].user)
    return {
        "details": details,
        "approvals": [(a, what_summary(a)) for a in details.approvals_for_me],
        "problems": [(r, coloured_status(r.status), error_text(r.error)) for r in details.recent_problems],
        "rows": [
            (
                "Pending approvals",
                counts.pending_approvals,
                reverse("admin:approvals_approval_changelist") + "?status__exact=pending",
            ),
            ("Failed runs (24 h)", counts.failed_runs, runs + "?status__exact=failed"),
            ("Runs needing attention (24 h)", counts.attention_runs, runs + "?status__exact=needs_attention"),
        ],
    }
