"""Triggers in the admin: read-only rows (they come from definitions), with token actions.

Every action calls the same service as the API; a new token or signing secret is
shown once, in the admin message, and never stored in plain text.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Prefetch
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from automations.admin import AutomationAdmin, WorkspaceScopedAdmin
from automations.models import Automation
from workspaces.access import may_act, workspace_ids_for
from workspaces.models import Permission

from . import services
from .models import Trigger, TriggerType, WebhookRateWindow
from .schedules import next_fire_at


def token_state(obj: Trigger) -> str:
    if obj.type != TriggerType.WEBHOOK:
        return "-"
    if not obj.token_hash:
        return "none"
    return "revoked" if obj.token_revoked_at else "active"


# Minting a webhook token or signing secret lets its holder start runs: the workspace admin's
# (as in the API); revoking one is any operator's.
ADMIN_ACTIONS = ("rotate_token", "rotate_signing_secret")


@admin.register(Trigger)
class TriggerAdmin(WorkspaceScopedAdmin):
    list_display = [
        "key",
        "automation",
        "type",
        "enabled",
        "next_fire",
        "last_fired_at",
        "token_state",
        "workspace",
    ]
    list_filter = ["type", "enabled", "workspace"]
    search_fields = ["key", "automation__name", "=id", "event_type"]
    list_select_related = ["automation", "workspace"]
    actions = ["rotate_token", "revoke_token", "rotate_signing_secret"]
    fields = readonly_fields = (
        "id", "automation", "workspace", "key", "type", "config", "enabled", "event_type", "next_fire",
        "last_fired_at", "last_scheduled_for", "token_state", "token_created_at", "token_revoked_at",
        "has_signing_secret", "signing_secret_created_at", "periodic_task", "created_at", "updated_at",
    )  # fmt: skip

    @admin.display(description="next fire")
    def next_fire(self, obj: Trigger):
        return next_fire_at(obj) or "-"

    @admin.display(description="token")
    def token_state(self, obj: Trigger) -> str:
        return token_state(obj)

    @admin.display(boolean=True, description="signing secret")
    def has_signing_secret(self, obj: Trigger) -> bool:
        return obj.has_signing_secret

    def has_add_permission(self, request):
        return False  # triggers come from the automation's definition

    def has_delete_permission(self, request, obj=None):
        return False  # remove the trigger from the definition instead

    def get_actions(self, request):
        actions = super().get_actions(request)
        if not request.user.is_superuser and not workspace_ids_for(request.user, Permission.ADMINISTER):
            for name in ADMIN_ACTIONS:
                actions.pop(name, None)
        return actions

    def changelist_view(self, request, extra_context=None):
        # An action not offered is otherwise a silent "no action selected": reached directly, it is a 403.
        if request.method == "POST" and request.POST.get("action") in ADMIN_ACTIONS:
            if request.POST.get("action") not in self.get_actions(request):
                raise PermissionDenied
        return super().changelist_view(request, extra_context)

    def _webhooks(self, request, queryset, permission: str = Permission.OPERATE):
        """The selected webhook triggers; every one must be in a workspace where the user holds
        ``permission``, else nothing is done (403)."""
        if any(
            not may_act(request.user, ws, permission)
            for ws in set(queryset.values_list("workspace_id", flat=True))
        ):
            raise PermissionDenied
        chosen = list(queryset.filter(type=TriggerType.WEBHOOK))
        if len(chosen) != queryset.count():
            self.message_user(request, "Only webhook triggers have tokens; the others were left alone.",
                              messages.WARNING)  # fmt: skip
        return chosen

    @admin.action(description="Rotate token (shown once)")
    def rotate_token(self, request, queryset):
        for trigger in self._webhooks(request, queryset, Permission.ADMINISTER):
            token = services.trigger_token_rotate(trigger=trigger, user=request.user)
            self.message_user(
                request, f"New token for {trigger.automation} / {trigger.key} (copy it now, it is not shown again): "
                f"{token}", messages.WARNING,
            )  # fmt: skip

    @admin.action(description="Revoke token")
    def revoke_token(self, request, queryset):
        for trigger in self._webhooks(request, queryset):
            services.trigger_token_revoke(trigger=trigger, user=request.user)
            self.message_user(
                request, f"Token of {trigger.automation} / {trigger.key} revoked.", messages.SUCCESS
            )

    @admin.action(description="Rotate signing secret (shown once)")
    def rotate_signing_secret(self, request, queryset):
        for trigger in self._webhooks(request, queryset, Permission.ADMINISTER):
            secret = services.trigger_signing_secret_rotate(trigger=trigger, user=request.user)
            self.message_user(
                request, f"New signing secret for {trigger.automation} / {trigger.key} (copy it now, it is not "
                f"shown again): {secret}", messages.WARNING,
            )  # fmt: skip


@admin.register(WebhookRateWindow)
class WebhookRateWindowAdmin(admin.ModelAdmin):
    list_display = ["trigger", "window_start", "hits"]
    list_select_related = ["trigger"]
    readonly_fields = ["trigger", "window_start", "hits"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


def webhook_path(trigger: Trigger) -> str:
    return reverse("automation-fire", args=[trigger.automation_id])


class TriggeredAutomationAdmin(AutomationAdmin):
    """The engine's automation admin with what only the triggers app knows: trigger types, the next
    scheduled fire and each trigger's webhook URL (the engine never imports triggers)."""

    list_display = [
        *AutomationAdmin.list_display[:-1],
        "trigger_types",
        "next_fire",
        AutomationAdmin.list_display[-1],
    ]
    PAGES = ["trigger_table", *AutomationAdmin.PAGES]

    def get_queryset(self, request):
        # One query for the page's triggers, whatever the page size.
        return (
            super()
            .get_queryset(request)
            .prefetch_related(Prefetch("triggers", queryset=Trigger.objects.order_by("key")))
        )

    @admin.display(description="triggers")
    def trigger_types(self, automation: Automation) -> str:
        return ", ".join(sorted({t.type for t in automation.triggers.all()})) or "manual only"

    @admin.display(description="triggers")
    def trigger_table(self, automation: Automation):
        """What fires it, when next, and where to POST a webhook (the token is shown once, on rotate)."""
        rows = []
        for trigger in automation.triggers.all():
            url = (
                format_html('<code class="webhook-url">POST {}</code>', webhook_path(trigger))
                if trigger.type == TriggerType.WEBHOOK
                else "-"
            )
            manage = reverse("admin:triggers_trigger_change", args=[trigger.pk])
            rows.append(
                (
                    manage,
                    trigger.key,
                    trigger.type,
                    "yes" if trigger.enabled else "no",
                    next_fire_at(trigger) or "-",
                    url,
                    token_state(trigger),
                    trigger.last_fired_at or "-",
                )
            )
        if not rows:
            return "none: runs start from Run, the API or a re-run"
        body = format_html_join(
            "",
            '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>'
            "<td>{}</td><td>{}</td></tr>",
            rows,
        )
        return format_html(
            '<table id="triggers"><tr><th>key</th><th>type</th><th>enabled</th><th>next fire</th>'
            "<th>webhook URL</th><th>token</th><th>last fired</th></tr>{}</table>"
            "<p>A workspace admin rotates a webhook's token from its trigger page (the token is shown once).</p>",
            body,
        )

    @admin.display(description="next fire")
    def next_fire(self, automation: Automation):
        times = [when for t in automation.triggers.all() if (when := next_fire_at(t)) is not None]
        return min(times) if times else "-"


admin.site.unregister(Automation)
admin.site.register(Automation, TriggeredAutomationAdmin)
