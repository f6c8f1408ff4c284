"""Read-only admin for the ledger (newest first, scoped to the user's workspaces, a trace per run),
with "Verify the ledger" and "write checkpoint now".

Verifying walks the ledger for superusers (what ``manage.py audit_verify`` runs); anyone else
is shown the last verification of their workspaces' chains (:mod:`audit.verifications`), as
``GET /api/v1/audit/verify`` is: a walk per click would let any viewer load the database."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from config.admin_paging import HistoryAdminMixin
from workspaces.access import workspace_ids_for
from workspaces.models import Permission

from . import selectors
from .checkpoints import checkpoint_write
from .models import AuditChainHead, AuditCheckpoint, AuditEvent
from .verifications import verification_latest
from .verify import verify_all
from .writer import chain_for


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _one_line(text: str, width: str):
    return format_html('<span title="{}" style="display:inline-block;max-width:{};white-space:nowrap;'
                       'overflow:hidden;text-overflow:ellipsis;vertical-align:bottom">{}</span>', text, width, text)  # fmt: skip


def _report(modeladmin, request, chains=None):
    note = ""
    if request.user.is_superuser:
        result = verify_all(chains)
    else:
        visible = {chain_for(ws_id) for ws_id in workspace_ids_for(request.user, Permission.VIEW)}
        result, verified_at, full = verification_latest(visible if chains is None else set(chains) & visible)
        if verified_at is not None:
            when = timezone.localtime(verified_at).strftime("%Y-%m-%d %H:%M:%S")
            note = f" (the last {'full' if full else 'incremental'} verification, at {when})"
    modeladmin.message_user(
        request, result.summary() + note, messages.SUCCESS if result.ok else messages.ERROR
    )


def _may_checkpoint(request) -> bool:
    return request.user.is_superuser or request.user.has_perm("audit.add_auditcheckpoint")


# The types an operator filters by most. Fixed, because a filter built from the ledger
# would be a SELECT DISTINCT over every event; any other type works as ?type=<type>.
COMMON_TYPES = (
    "run.created", "run.started", "run.succeeded", "run.failed", "run.cancelled", "run.timed_out",
    "run.needs_attention", "run.waiting", "run.suppressed", "step.started", "step.succeeded", "step.failed",
    "step.retrying", "step.outcome_unknown", "gate.blocked", "approval.requested", "approval.approved",
    "approval.denied", "approval.expired", "event.published", "webhook.rejected", "history.pruned",
)  # fmt: skip


class TypeFilter(admin.SimpleListFilter):
    title = "type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        return [(t, t) for t in COMMON_TYPES]

    def queryset(self, request, queryset):
        return selectors.of_type(queryset, self.value()) if self.value() else queryset


@admin.register(AuditEvent)
class AuditEventAdmin(HistoryAdminMixin, ReadOnlyAdmin):
    # Short cells (the actor clipped, the whole text on hover) and a summary that wraps, so every column
    # fits a 1400 px window beside the filters.
    list_display = ["id", "at", "type", "outcome", "trace", "actor_line", "summary_line"]
    list_filter = [TypeFilter, "outcome"]
    ordering = ["-id"]  # newest first
    search_fields = ["trace_id", "type"]
    search_help_text = "a trace id, a run id or an event type (exact)"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]
    actions = ["verify_chain"]
    change_list_template = "admin/audit/auditevent/change_list.html"

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # Three index lookups (audit_trace_prefix_idx, audit_type_key_idx, audit_run_ref_key_idx), never LIKE '%q%'.
        by_run = selectors.of_run(queryset, term)
        by_trace = selectors.of_trace(queryset, term)
        return by_trace | selectors.of_type(queryset, term) | by_run, False

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if trace := request.GET.get("trace_id"):
            # The changelist adds trace_id = ...; the indexed prefix makes it an index scan.
            queryset = selectors.of_trace(queryset, trace)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(workspace_id__in=workspace_ids_for(request.user, Permission.VIEW))

    @admin.display(description="actor")
    def actor_line(self, event: AuditEvent):
        return _one_line(event.actor, "9em")

    @admin.display(description="summary")
    def summary_line(self, event: AuditEvent):
        return format_html('<span style="overflow-wrap:anywhere">{}</span>', event.summary)

    @admin.display(description="timestamp", ordering="id")
    def at(self, event: AuditEvent) -> str:
        return timezone.localtime(event.timestamp).strftime("%b %d %H:%M:%S")

    @admin.display(description="trace")  # not sortable: only a prefix of it is indexed
    def trace(self, event: AuditEvent):
        url = reverse("admin:audit_auditevent_changelist") + f"?trace_id={event.trace_id}"
        return format_html('<a href="{}" title="show this trace">{}</a>', url, event.trace_id[:12])

    @admin.action(description="Verify chain (of the selected events)")
    def verify_chain(self, request, queryset):
        _report(self, request, queryset.order_by().values_list("chain", flat=True).distinct())

    def get_urls(self):
        extra = [
            path("verify/", self.admin_site.admin_view(self.verify_view), name="audit_auditevent_verify")
        ]
        return extra + super().get_urls()

    def verify_view(self, request):
        """POST from the list's button: verify every chain, as ``manage.py audit_verify`` does."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_view_permission(request):
            raise PermissionDenied
        _report(self, request)
        return HttpResponseRedirect(reverse("admin:audit_auditevent_changelist"))

    def changelist_view(self, request, extra_context=None):
        trace = request.GET.get("trace_id", "")
        latest = AuditCheckpoint.objects.order_by("-id").values("created_at", "chain", "seq").first()
        extra = {"trace": trace, "latest_checkpoint": latest}
        if trace:
            extra["title"] = f"Audit trace {trace}"
        return super().changelist_view(request, {**(extra_context or {}), **extra})


@admin.register(AuditCheckpoint)
class AuditCheckpointAdmin(ReadOnlyAdmin):
    list_display = ["id", "chain", "seq", "created_at", "key_id", "head_hash"]
    list_filter = ["chain", "key_id"]
    search_fields = ["chain", "head_hash"]
    readonly_fields = [f.name for f in AuditCheckpoint._meta.fields]
    actions = ["write_checkpoint_now", "verify_chain"]
    change_list_template = "admin/audit/auditcheckpoint/change_list.html"

    @admin.action(description="Write checkpoint now (for the selected chains)")
    def write_checkpoint_now(self, request, queryset):
        if not _may_checkpoint(request):
            self.message_user(request, "You may not write checkpoints.", messages.ERROR)
            return
        written = []
        for chain in queryset.order_by().values_list("chain", flat=True).distinct():
            written += checkpoint_write(chain)
        self.message_user(request, f"{len(written)} checkpoint(s) written.", messages.SUCCESS)

    @admin.action(description="Verify chain (of the selected checkpoints)")
    def verify_chain(self, request, queryset):
        _report(self, request, queryset.order_by().values_list("chain", flat=True).distinct())

    def get_urls(self):
        extra = [
            path(
                "write-now/",
                self.admin_site.admin_view(self.write_all_view),
                name="audit_auditcheckpoint_write_now",
            )
        ]
        return extra + super().get_urls()

    def write_all_view(self, request):
        """POST from the change list's button: checkpoint every chain that moved."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not _may_checkpoint(request):
            self.message_user(request, "You may not write checkpoints.", messages.ERROR)
        else:
            written = checkpoint_write()
            self.message_user(request, f"{len(written)} checkpoint(s) written.", messages.SUCCESS)
        return HttpResponseRedirect(reverse("admin:audit_auditcheckpoint_changelist"))

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "may_checkpoint": _may_checkpoint(request)}
        return super().changelist_view(request, extra_context)


@admin.register(AuditChainHead)
class AuditChainHeadAdmin(ReadOnlyAdmin):
    list_display = ["chain", "seq", "head_hash"]
    search_fields = ["chain"]
    actions = ["verify_chain"]

    @admin.action(description="Verify chain")
    def verify_chain(self, request, queryset):
        _report(self, request, queryset.values_list("chain", flat=True))
