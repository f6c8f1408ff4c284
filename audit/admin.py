"""Read-only admin for the ledger, with "verify chain" and "write checkpoint now"."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Q
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse

from config.admin_paging import HistoryAdminMixin

from . import selectors
from .checkpoints import checkpoint_write
from .models import AuditChainHead, AuditCheckpoint, AuditEvent
from .verify import verify_all


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def _report(modeladmin, request, chains):
    result = verify_all(chains)
    if result.ok:
        modeladmin.message_user(
            request,
            f"Chain intact: {result.events} events and {result.checkpoints} checkpoints verified "
            f"in {len(result.chains)} chain(s).",
            messages.SUCCESS,
        )
    else:
        modeladmin.message_user(request, f"Chain BROKEN: {result.broken}", messages.ERROR)


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
        return queryset.filter(type=self.value()) if self.value() else queryset


@admin.register(AuditEvent)
class AuditEventAdmin(HistoryAdminMixin, ReadOnlyAdmin):
    list_display = ["id", "timestamp", "type", "outcome", "trace_id", "actor", "summary"]
    list_filter = [TypeFilter, "outcome"]
    ordering = ["-id"]
    search_fields = ["trace_id", "type"]
    search_help_text = "a trace id, a run id or an event type (exact)"
    readonly_fields = [f.name for f in AuditEvent._meta.fields]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        # Three index lookups (audit_trace_idx, audit_type_idx, audit_run_ref_idx), never LIKE '%q%'.
        by_run = selectors.of_run(queryset, term)
        return queryset.filter(Q(trace_id=term) | Q(type=term)) | by_run, False

    actions = ["verify_chain"]

    @admin.action(description="Verify chain (of the selected events)")
    def verify_chain(self, request, queryset):
        _report(self, request, queryset.order_by().values_list("chain", flat=True).distinct())


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
