from __future__ import annotations

from django.contrib import admin

from .models import Heartbeat


@admin.register(Heartbeat)
class HeartbeatAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "queues", "hostname", "pid", "started_at", "seen_at")
    list_filter = ("kind",)
    search_fields = ("name", "hostname")
    readonly_fields = ("name", "kind", "queues", "hostname", "pid", "started_at", "seen_at")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
