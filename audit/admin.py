"""Read-only admin for the ledger, with "verify chain" and "write checkpoint now"."""

from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import path, reverse

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


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdmin):
    list_display = ["id", "timestamp", "type", "outcome", "trace_id", "actor", "summary"]
    list_filter = ["type", "outcome"]
    search_fields = ["trace_id", "type", "summary"]
    readonly_fields = [f.name for f in AuditEvent._meta.fields]
    show_full_result_count = False  # COUNT(*) over the whole ledger is slow and says little
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
