"""Operator surface in the Django admin; every action calls the same services as the API."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from capabilities import llm
from config.errors import ServiceError
from workspaces.access import workspaces_for
from workspaces.models import Permission, Workspace

from . import services
from .authoring import drafts
from .dispatcher import DispatchError
from .models import Automation, AutomationVersion, DomainEvent, Draft, Run, StepRun


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
        # On the change page ``workspace`` is read-only (not a form field): validate against the
        # automation's own workspace, so an invalid definition is an inline error, never a 500.
        workspace = cleaned.get("workspace") if "workspace" in self.fields else self.instance.workspace
        definition = cleaned.get("definition")
        if workspace is not None and definition is not None:
            try:
                services.definition_check(
                    definition, workspace, self.instance.pk if self.instance.pk else None
                )
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


class WorkspaceScopedAdmin(admin.ModelAdmin):
    """Staff see only the rows of workspaces they may view (superusers see all), as in the API."""

    workspace_lookup = "workspace"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        visible = workspaces_for(request.user, Permission.VIEW).values("id")
        return queryset.filter(**{f"{self.workspace_lookup}__in": visible})


@admin.register(Automation)
class AutomationAdmin(WorkspaceScopedAdmin):
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

    def get_deleted_objects(self, objs, request):
        # Versions, triggers and finished runs go with their automation; the service
        # decides what may be deleted (no active runs) and audits it.
        deleted, model_count, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, model_count, set(), protected

    def delete_queryset(self, request, queryset):
        """The bulk "Delete selected" action: the same service, audit and checks as one delete."""
        for automation in queryset:
            try:
                services.automation_delete(automation=automation, user=request.user)
            except services.RunActionRefused as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)

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
class RunAdmin(WorkspaceScopedAdmin):
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
class StepRunAdmin(WorkspaceScopedAdmin):
    workspace_lookup = "run__workspace"

    list_display = ["run", "step_id", "action", "status", "attempt", "started_at", "finished_at"]
    list_filter = ["status", "action"]
    search_fields = ["run__id", "step_id", "idempotency_key"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(DomainEvent)
class DomainEventAdmin(WorkspaceScopedAdmin):
    list_display = ["event_type", "workspace", "source", "created_at", "chain_depth"]
    list_filter = ["event_type", "workspace"]
    search_fields = ["event_type", "trace_id", "source"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class DraftPromptForm(forms.Form):
    workspace = forms.ModelChoiceField(queryset=Workspace.objects.none())
    automation = forms.ModelChoiceField(
        queryset=Automation.objects.none(), required=False,
        help_text="Optional: edit this automation (the draft shows a diff against its current version).",
    )  # fmt: skip
    prompt = forms.CharField(
        max_length=drafts.MAX_PROMPT_CHARS,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 100}),
        help_text="e.g. every weekday at 9 post yesterday's failed runs to our webhook",
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        operable = workspaces_for(user, Permission.OPERATE)
        self.fields["workspace"].queryset = operable
        self.fields["automation"].queryset = Automation.objects.filter(workspace__in=operable)

    def clean(self):
        cleaned = super().clean()
        automation, workspace = cleaned.get("automation"), cleaned.get("workspace")
        if automation is not None and workspace is not None and automation.workspace_id != workspace.id:
            raise forms.ValidationError("that automation is in another workspace")
        return cleaned


@admin.register(Draft)
class DraftAdmin(admin.ModelAdmin):
    """ "New from a sentence": prompt → review (summary, flags, definition or diff) → Save or Discard."""

    list_display = [
        "created_at",
        "workspace",
        "status",
        "short_prompt",
        "model",
        "rounds",
        "cost_usd",
        "expires_at",
    ]
    list_filter = ["status"]
    search_fields = ["prompt", "id"]
    change_list_template = "admin/automations/draft/change_list.html"

    def get_queryset(self, request):
        queryset = super().get_queryset(request).select_related("workspace", "automation")
        if request.user.is_superuser:
            return queryset
        return queryset.filter(workspace__in=workspaces_for(request.user, Permission.VIEW).values("id"))

    @admin.display(description="prompt")
    def short_prompt(self, draft: Draft) -> str:
        return draft.prompt[:80]

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def _page(self, request, template: str, **context):
        return TemplateResponse(request, f"admin/automations/draft/{template}",
                                {**self.admin_site.each_context(request), "opts": self.model._meta, **context})  # fmt: skip

    def add_view(self, request, form_url="", extra_context=None):
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = DraftPromptForm(request.POST or None, user=request.user)
        context = {"configured": llm.llm_config() is not None, "form": form, "title": "New from a sentence"}
        if request.method == "POST" and context["configured"] and form.is_valid():
            try:
                draft = drafts.draft_create(workspace=form.cleaned_data["workspace"], user=request.user,
                                            prompt=form.cleaned_data["prompt"],
                                            automation=form.cleaned_data["automation"])  # fmt: skip
            except ServiceError as exc:
                context.update(error=f"{exc.code}: {exc.message}", problems=exc.errors or [])
            else:
                return redirect("admin:automations_draft_change", draft.pk)
        return self._page(request, "new.html", **context)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        draft = self.get_queryset(request).filter(pk=object_id).first()
        if not self.has_view_permission(request, draft):
            raise PermissionDenied
        if draft is None:
            raise Http404("draft not found")
        context: dict = {"draft": draft, "title": f"Draft: {draft.prompt[:60]}",
                         "pretty": json.dumps(draft.definition, indent=2, ensure_ascii=False)}  # fmt: skip
        if request.method == "POST":
            try:
                if "_save_draft" in request.POST:
                    automation = drafts.draft_save(draft=draft, user=request.user)
                    self.message_user(request, f"saved as {automation.name} (version {automation.version})")
                    return redirect("admin:automations_automation_change", automation.pk)
                if "_discard_draft" in request.POST:
                    drafts.draft_discard(draft=draft, user=request.user)
                    self.message_user(request, "draft discarded")
                    return redirect("admin:automations_draft_changelist")
            except ServiceError as exc:
                context.update(error=f"{exc.code}: {exc.message}", problems=exc.errors or [])
        return self._page(request, "review.html", **context)
