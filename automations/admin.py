"""Operator surface in the Django admin; every action calls the same services as the API."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.utils.html import format_html, format_html_join

from . import services
from .dispatcher import DispatchError
from .models import Automation, AutomationVersion, DomainEvent, Run, StepRun


class DefinitionField(forms.JSONField):
    widget = forms.Textarea(
        attrs={"rows": 30, "cols": 110, "style": "font-family: monospace", "spellcheck": "false"}
    )


class AutomationForm(forms.ModelForm):
    definition = DefinitionField(help_text="The automation definition (JSON). See /api/v1/schema/definition.")

    class Meta:
        model = Automation
        fields = ["workspace", "definition", "status"]

    def clean(self):
        cleaned = super().clean()
        workspace, definition = cleaned.get("workspace"), cleaned.get("definition")
        if workspace is not None and definition is not None:
            try:
                services.definition_check(definition, workspace)
            except services.DefinitionInvalid as exc:
                problems = [f"{e['path']}: {e['message']} ({e['code']})" for e in exc.errors]
                raise forms.ValidationError({"definition": problems}) from None
        return cleaned


class VersionInline(admin.TabularInline):
    model = AutomationVersion
    extra = 0
    can_delete = False
    fields = ["version", "created_at", "created_by", "pretty_definition"]
    readonly_fields = fields
    ordering = ["-version"]

    @admin.display(description="definition")
    def pretty_definition(self, obj):
        return format_html(
            "<pre style='max-height:12em;overflow:auto'>{}</pre>", json.dumps(obj.definition, indent=2)
        )

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Automation)
class AutomationAdmin(admin.ModelAdmin):
    form = AutomationForm
    list_display = ["name", "workspace", "status", "version", "updated_at"]
    list_filter = ["status", "workspace"]
    search_fields = ["name", "id"]
    inlines = [VersionInline]
    actions = ["run_now", "pause", "resume"]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace"] if obj else []

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            saved = services.automation_update(automation=obj, user=request.user, definition=data["definition"],
                                               status=data["status"])  # fmt: skip
        else:
            saved = services.automation_create(workspace=data["workspace"], definition=data["definition"],
                                               user=request.user, status=data["status"])  # fmt: skip
        obj.pk = saved.pk

    def save_related(self, request, form, formsets, change):
        """Versions are written by the service, never edited here."""

    def delete_model(self, request, obj):
        services.automation_delete(automation=obj, user=request.user)

    @admin.action(description="Run now")
    def run_now(self, request, queryset):
        for automation in queryset:
            try:
                result = services.run_create(automation=automation, inputs={}, user=request.user)
            except DispatchError as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
                continue
            if result.suppressed:
                self.message_user(
                    request, f"{automation.name}: suppressed (a run is active)", messages.WARNING
                )
            else:
                self.message_user(request, f"{automation.name}: run {result.run.pk} queued")

    @admin.action(description="Pause")
    def pause(self, request, queryset):
        for automation in queryset:
            services.automation_update(automation=automation, user=request.user, status="paused")
        self.message_user(request, f"paused {queryset.count()} automation(s)")

    @admin.action(description="Resume")
    def resume(self, request, queryset):
        for automation in queryset:
            services.automation_update(automation=automation, user=request.user, status="active")
        self.message_user(request, f"resumed {queryset.count()} automation(s)")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "automation", "status", "trigger_type", "created_at", "finished_at", "cost_usd"]
    list_filter = ["status", "trigger_type", "queue", "workspace"]
    search_fields = ["id", "trace_id", "automation__name"]
    date_hierarchy = "created_at"
    actions = ["cancel", "rerun", "resolve_succeeded", "resolve_retry", "resolve_failed"]
    readonly_fields = ["automation", "automation_version", "status", "trigger_type", "trigger_key", "triggered_by",
                       "trace_id", "queue", "inputs", "output", "error", "cost_usd", "created_at", "started_at",
                       "finished_at", "timeline"]  # fmt: skip
    fields = readonly_fields

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="step timeline")
    def timeline(self, run: Run):
        rows = run.steps.order_by("-phase", "index")
        header = format_html(
            "<tr><th>phase</th><th>step</th><th>action</th><th>status</th><th>attempt</th>"
            "<th>started</th><th>duration ms</th><th>error</th></tr>"
        )
        body = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((s.phase, s.step_id, s.action, s.status, s.attempt, s.started_at or "",
              f"{s.duration_ms:.1f}" if s.duration_ms is not None else "",
              f"{s.error_code}: {s.error_message}" if s.error_code else "") for s in rows),
        )  # fmt: skip
        return format_html("<table>{}{}</table>", header, body)

    def _each(self, request, queryset, label, fn):
        for run in queryset:
            try:
                fn(run)
            except services.RunActionRefused as exc:
                self.message_user(request, f"run {run.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"run {run.pk}: {label}")

    @admin.action(description="Cancel")
    def cancel(self, request, queryset):
        self._each(
            request, queryset, "cancel requested", lambda r: services.run_cancel(run=r, user=request.user)
        )

    @admin.action(description="Re-run")
    def rerun(self, request, queryset):
        self._each(request, queryset, "re-run queued", lambda r: services.run_rerun(run=r, user=request.user))

    @admin.action(description="Resolve: the step succeeded")
    def resolve_succeeded(self, request, queryset):
        self._each(request, queryset, "resolved as succeeded",
                   lambda r: services.run_resolve(run=r, resolution="succeeded", user=request.user))  # fmt: skip

    @admin.action(description="Resolve: retry the step")
    def resolve_retry(self, request, queryset):
        self._each(request, queryset, "retry queued",
                   lambda r: services.run_resolve(run=r, resolution="retry", user=request.user))  # fmt: skip

    @admin.action(description="Resolve: fail the run")
    def resolve_failed(self, request, queryset):
        self._each(request, queryset, "failed",
                   lambda r: services.run_resolve(run=r, resolution="failed", user=request.user))  # fmt: skip


@admin.register(StepRun)
class StepRunAdmin(admin.ModelAdmin):
    list_display = ["run", "step_id", "action", "status", "attempt", "started_at", "finished_at"]
    list_filter = ["status", "action"]
    search_fields = ["run__id", "step_id", "idempotency_key"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(DomainEvent)
class DomainEventAdmin(admin.ModelAdmin):
    list_display = ["event_type", "workspace", "source", "created_at", "chain_depth"]
    list_filter = ["event_type", "workspace"]
    search_fields = ["event_type", "trace_id", "source"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
