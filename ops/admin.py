"""Site-wide admin configuration (``ops`` is the last installed app, so every other admin is
registered by the time this runs) and the worker heartbeat admin."""

from __future__ import annotations

from django.contrib import admin
from django_celery_beat import models as beat
from rest_framework.authtoken.models import TokenProxy

from .models import Heartbeat

admin.site.site_header = "autoplane"
admin.site.site_title = "autoplane"
admin.site.index_title = "Operator console"
admin.site.index_template = "admin/autoplane_index.html"  # adds the "Needs you" panel

# Schedules are edited through triggers only (the trigger service owns its periodic task), and API
# tokens are hashed workspaces.ApiToken rows (their own admin): the raw django-celery-beat admins would
# let an operator change schedules out of band, and DRF's plaintext token table is unused.
HIDDEN = (beat.PeriodicTask, beat.IntervalSchedule, beat.CrontabSchedule, beat.SolarSchedule,
          beat.ClockedSchedule, TokenProxy)  # fmt: skip
for model in HIDDEN:
    if admin.site.is_registered(model):
        admin.site.unregister(model)


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
