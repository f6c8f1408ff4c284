"""Operator surface in the Django admin; every action calls the same services as the API."""

from __future__ import annotations

import json
import uuid

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Q
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext_lazy as _

from capabilities import llm, registry
from config.admin_paging import HistoryAdminMixin
from config.celery import QUEUES
from config.errors import ServiceError
from workspaces.access import may_act, workspace_ids_for, workspaces_for
from workspaces.api import require_or_superuser
from workspaces.models import Permission, Workspace

from . import selectors, services
from .admin_forms import DefinitionEditor, PrettyJSONField, RerunForm, ResolveForm, RunInputsForm
from .authoring import drafts
from .models import (
    ACTIVE_RUN_STATUSES,
    Automation,
    DomainEvent,
    Draft,
    Run,
    RunStatus,
    StepRun,
)

STATUS_COLOURS = {
    "succeeded": "#2e7d32", "failed": "#c62828", "timed_out": "#c62828", "needs_attention": "#ef6c00",
    "awaiting_approval": "#6a1b9a", "running": "#1565c0", "queued": "#555", "waiting": "#555", "cancelled": "#777",
}  # fmt: skip


def coloured_status(status: str | None):
    if not status:
        return "-"
    return format_html('<b style="color:{}">{}</b>', STATUS_COLOURS.get(status, "inherit"), status)


def _pretty(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


def error_text(error) -> str:
    if not isinstance(error, dict) or not error:
        return ""
    message = str(error.get("message", ""))
    return f"{error.get('code', '')}: {message[:80]}{'…' if len(message) > 80 else ''}"


def _clipped(text: str, width: str):
    """One line at most ``width`` wide; the whole text on hover."""
    return format_html('<span title="{}" style="display:inline-block;max-width:{};white-space:nowrap;'
                       'overflow:hidden;text-overflow:ellipsis;vertical-align:bottom">{}</span>', text, width, text)  # fmt: skip


def _folded(value):
    if value is None:
        return ""
    return format_html("<details><summary>show</summary><pre>{}</pre></details>", _pretty(value))


class AutomationForm(forms.ModelForm):
    user = None  # set by AutomationAdmin.get_form
    definition = PrettyJSONField(widget=DefinitionEditor(),
                                 help_text="The automation definition (JSON). See /api/v1/schema/definition.")  # fmt: skip

    class Meta:
        model = Automation
        fields = ["workspace", "definition", "status"]

    def clean(self):
        cleaned = super().clean()
        # On the change page ``workspace`` is read-only (not a form field): validate against the
        # automation's own workspace, so an invalid definition is an inline error, never a 500.
        workspace = cleaned.get("workspace") if "workspace" in self.fields else self.instance.workspace
        definition = cleaned.get("definition")
        if workspace is not None and not may_act(self.user, workspace.id, Permission.OPERATE):
            raise forms.ValidationError("your role in this workspace does not allow editing automations")
        if self.instance.pk and self.instance.archived_at is not None:
            raise forms.ValidationError("this automation is archived: it can be read, not edited")
        if self.instance.pk and self.instance.review_required and cleaned.get("status") == "active":
            raise forms.ValidationError({"status": "an apply raised its risk: a workspace admin activates it "
                                                   "with the action 'Activate after review'"})  # fmt: skip
        if workspace is not None and definition is not None:
            try:
                services.definition_check(
                    definition, workspace, self.instance.pk if self.instance.pk else None
                )
            except services.DefinitionInvalid as exc:
                problems = [f"{e['path']}: {e['message']} ({e['code']})" for e in exc.errors]
                raise forms.ValidationError({"definition": problems}) from None
        return cleaned


class WorkspaceScopedAdmin(admin.ModelAdmin):
    """Staff see only the rows of workspaces they may view (superusers see all), as in the API."""

    workspace_lookup = "workspace"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        visible = workspace_ids_for(request.user, Permission.VIEW)  # ids, so the planner sees real numbers
        return queryset.filter(**{f"{self.workspace_lookup}__in": visible})


@admin.register(Automation)
class AutomationAdmin(WorkspaceScopedAdmin):
    form = AutomationForm
    list_display = [
        "name",
        "workspace",
        "status",
        "review_required",
        "version",
        "last_run",
        "last_run_at",
        "runs_24h",
        "updated_at",
    ]
    list_filter = ["status", "workspace"]
    search_fields = ["name", "id"]
    actions = ["run_now", "pause", "resume", "activate_reviewed", "purge"]
    change_form_template = "admin/automations/automation/change_form.html"
    PAGES = ["recent_runs", "version_history"]

    def get_queryset(self, request):
        return selectors.with_last_run(super().get_queryset(request)).select_related("workspace")

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["workspace", "definition", "status"]
        shown = "definition" if self.has_change_permission(request, obj) else "pretty_definition"
        return ["workspace", shown, "status", "effective_autonomy", *self.PAGES]

    def get_readonly_fields(self, request, obj=None):
        return ["workspace", "pretty_definition", "effective_autonomy", *self.PAGES] if obj else []

    @admin.display(description="effective autonomy")
    def effective_autonomy(self, obj):
        """What its steps are gated at now: its own autonomy (else the workspace default), within the
        workspace's ceiling; and what the ceilings change, if anything."""
        notices = selectors.ceiling_notices(obj.definition, obj.workspace)
        effective = selectors.definition_autonomy(obj.definition, obj.workspace)
        return "; ".join([effective, *(n["message"] for n in notices)])

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.user = request.user
        return form

    # For one automation, the model permission and the role in its workspace: a viewer or an approver
    # gets the read-only page (no Save, no Delete), not a form whose Delete would archive it.
    def has_change_permission(self, request, obj=None):
        allowed = super().has_change_permission(request, obj)
        return allowed and (obj is None or may_act(request.user, obj.workspace_id, Permission.OPERATE))

    def has_delete_permission(self, request, obj=None):
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or may_act(request.user, obj.workspace_id, Permission.OPERATE))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "workspace" and not request.user.is_superuser:
            kwargs["queryset"] = workspaces_for(request.user, Permission.OPERATE)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @admin.display(description="last run", ordering="last_run_status")
    def last_run(self, automation: Automation):
        return coloured_status(automation.last_run_status)

    @admin.display(description="last run at", ordering="last_run_at")
    def last_run_at(self, automation: Automation):
        return automation.last_run_at or "-"

    @admin.display(description="runs 24 h", ordering="runs_24h")
    def runs_24h(self, automation: Automation) -> int:
        return automation.runs_24h

    @admin.display(description="definition")
    def pretty_definition(self, automation: Automation):
        return format_html('<pre id="definition">{}</pre>', _pretty(automation.definition))

    @admin.display(description="recent runs")
    def recent_runs(self, automation: Automation):
        runs = selectors.recent_runs(automation)
        if not runs:
            return "none yet"
        rows = format_html_join("", "<tr><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            ((reverse("admin:automations_run_change", args=[run.pk]), str(run.pk)[:8], coloured_status(run.status),
              run.trigger_type, run.created_at, error_text(run.error)) for run in runs))  # fmt: skip
        more = reverse("admin:automations_run_changelist") + f"?automation__id__exact={automation.pk}"
        return format_html('<table id="recent-runs"><tr><th>run</th><th>status</th><th>trigger</th><th>created</th>'
                           '<th>error</th></tr>{}</table><p><a href="{}">all runs of this automation</a></p>',
                           rows, more)  # fmt: skip

    @admin.display(description="versions")
    def version_history(self, automation: Automation):
        rows = []
        for version, diff in selectors.version_history(automation):
            restore = ""
            if version.version != automation.version and getattr(automation, "may_restore", False):
                url = reverse("admin:automations_automation_restore", args=[automation.pk, version.version])
                restore = format_html('<a class="button" href="{}" id="restore-{}">Restore this version…</a>',
                                      url, version.version)  # fmt: skip
            shown = (format_html("<details><summary>diff from version {}</summary><pre>{}</pre></details>",
                                 version.version - 1, diff) if diff else "first version")  # fmt: skip
            rows.append((version.version, version.created_at, version.created_by or "-", shown, restore))
        body = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", rows)
        return format_html('<table id="versions"><tr><th>version</th><th>saved</th><th>by</th><th>change</th>'
                           "<th></th></tr>{}</table>", body)  # fmt: skip

    def get_object(self, request, object_id, from_field=None):
        """The object, marked with whether this user may restore its versions (version_history has no
        request): an operator of its workspace, while it is not archived (the service refuses both)."""
        automation = super().get_object(request, object_id, from_field)
        if automation is not None:
            automation.may_restore = automation.archived_at is None and may_act(
                request.user, automation.workspace_id, Permission.OPERATE
            )
        return automation

    def change_view(self, request, object_id, form_url="", extra_context=None):
        automation = self.get_object(request, object_id)
        extra = {}
        if automation is not None:
            extra["may_run"] = may_act(request.user, automation.workspace_id, Permission.OPERATE)
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    def get_urls(self):
        return [
            path("<uuid:object_id>/run/", self.admin_site.admin_view(self.run_view), name="automations_automation_run"),
            path("<uuid:object_id>/restore/<int:version>/", self.admin_site.admin_view(self.restore_view),
                 name="automations_automation_restore"),
        ] + super().get_urls()  # fmt: skip

    def _visible(self, request, object_id) -> Automation:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), pk=object_id)

    def _page(self, request, automation: Automation, template: str, **context):
        return TemplateResponse(request, f"admin/automations/automation/{template}", {
            **self.admin_site.each_context(request), "opts": self.model._meta, "original": automation,
            "automation_url": reverse("admin:automations_automation_change", args=[automation.pk]), **context})  # fmt: skip

    def run_view(self, request, object_id):
        """Run with inputs: the same service (and input validation) as ``POST /automations/{id}/run``."""
        automation = self._visible(request, object_id)
        form = RunInputsForm(request.POST if request.method == "POST" else None, automation=automation)
        if form.is_bound and form.is_valid():
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.OPERATE)
                result = services.run_create(automation=automation, inputs=form.inputs(), user=request.user)
            except ServiceError as exc:
                if exc.errors:
                    form.add_service_errors(exc.errors)
                else:
                    self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
                    return redirect("admin:automations_automation_change", automation.pk)
            else:
                if result.suppressed:
                    self.message_user(request, f"{automation.name}: not run, a run is active (drop_if_running)",
                                      messages.WARNING)  # fmt: skip
                    return redirect("admin:automations_automation_change", automation.pk)
                self.message_user(
                    request, f"{automation.name}: run {str(result.run.pk)[:8]} queued", messages.SUCCESS
                )
                return redirect("admin:automations_run_change", result.run.pk)
        return self._page(request, automation, "run.html", form=form, title=f"Run {automation.name}")

    def restore_view(self, request, object_id, version):
        automation = self._visible(request, object_id)
        old = get_object_or_404(automation.versions, version=version)
        if request.method == "POST":
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.OPERATE)
                saved = services.automation_version_restore(
                    automation=automation, version=version, user=request.user
                )
            except ServiceError as exc:
                problems = "; ".join(f"{e['path']}: {e['message']}" for e in exc.errors or [])
                self.message_user(request, f"{automation.name}: {exc.message}" + (f" ({problems})" if problems else ""),
                                  messages.ERROR)  # fmt: skip
            else:
                self.message_user(request, f"{saved.name}: version {version} restored as version {saved.version}",
                                  messages.SUCCESS)  # fmt: skip
            return redirect("admin:automations_automation_change", automation.pk)
        diff = selectors.definition_diff(automation.definition, old.definition, f"version {automation.version} (current)",
                                         f"version {version}")  # fmt: skip
        return self._page(request, automation, "restore.html", version=old, diff=diff, button=f"Restore version {version}",
                          title=f"Restore version {version} of {automation.name}?")  # fmt: skip

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            saved = services.automation_update(automation=obj, user=request.user, definition=data["definition"],
                                               status=data["status"])  # fmt: skip
        else:
            saved = services.automation_create(workspace=data["workspace"], definition=data["definition"],
                                               user=request.user, status=data["status"])  # fmt: skip
        obj.pk = saved.pk
        for notice in selectors.ceiling_notices(saved.definition, saved.workspace):
            self.message_user(request, f"{saved.name}: {notice['message']}", messages.WARNING)

    def save_related(self, request, form, formsets, change):
        """Versions are written by the service, never edited here."""

    def delete_model(self, request, obj):
        """Delete archives (as the API's DELETE does): the runs stay; purging is the separate action."""
        services.automation_archive(automation=obj, user=request.user)

    def get_deleted_objects(self, objs, request):
        # Nothing but the automation is affected: archiving keeps its runs, versions and triggers.
        names = [f"{obj} (archived: its runs, steps and versions stay readable)" for obj in objs]
        return names, {"automations": len(names)}, set(), []

    def delete_queryset(self, request, queryset):
        """The bulk "Delete selected" action: archives, with the same service, audit and checks as one."""
        for automation in queryset:
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.OPERATE)
                services.automation_archive(automation=automation, user=request.user)
            except ServiceError as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)

    @admin.action(description="Purge archived automations for good (runs, steps, versions; superusers)")
    def purge(self, request, queryset):
        if not request.user.is_superuser:
            self.message_user(request, "only a superuser may purge automations", messages.ERROR)
            return
        for automation in queryset:
            try:
                counts = services.automation_purge(automation=automation, user=request.user)
            except services.RunActionRefused as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
            else:
                self.message_user(
                    request, f"{automation.name} purged ({counts['runs']} runs)", messages.SUCCESS
                )

    @admin.action(description="Run now")
    def run_now(self, request, queryset):
        for automation in queryset:
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.OPERATE)
                result = services.run_create(automation=automation, inputs={}, user=request.user)
            except ServiceError as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
                continue
            if result.suppressed:
                self.message_user(
                    request, f"{automation.name}: suppressed (a run is active)", messages.WARNING
                )
            else:
                self.message_user(request, f"{automation.name}: run {result.run.pk} queued")

    def _set_status(self, request, queryset, status: str, done: str):
        for automation in queryset:
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.OPERATE)
                services.automation_update(automation=automation, user=request.user, status=status)
            except ServiceError as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{automation.name}: {done}")

    @admin.action(description="Pause")
    def pause(self, request, queryset):
        self._set_status(request, queryset, "paused", "paused")

    @admin.action(description="Resume")
    def resume(self, request, queryset):
        self._set_status(request, queryset, "active", "resumed")

    @admin.action(description="Activate after review (an apply raised its risk; workspace admins)")
    def activate_reviewed(self, request, queryset):
        for automation in queryset:
            try:
                require_or_superuser(request.user, automation.workspace_id, Permission.ADMINISTER)
                services.automation_review_activate(automation=automation, user=request.user)
            except ServiceError as exc:
                self.message_user(request, f"{automation.name}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{automation.name}: reviewed and activated")


class FixedChoicesFilter(admin.SimpleListFilter):
    """A filter whose choices are known in advance: never a ``SELECT DISTINCT`` over a big table."""

    choices_list: tuple[str, ...] = ()

    def lookups(self, request, model_admin):
        return [(value, value) for value in self.choices_list]

    def queryset(self, request, queryset):
        return queryset.filter(**{self.parameter_name: self.value()}) if self.value() else queryset


class TriggerTypeFilter(FixedChoicesFilter):
    title = _("trigger type")
    parameter_name = "trigger_type"
    choices_list = ("manual", "webhook", "schedule", "event")


class QueueFilter(FixedChoicesFilter):
    title = _("queue")
    parameter_name = "queue"
    choices_list = QUEUES


class ActionFilter(FixedChoicesFilter):
    title = _("action")
    parameter_name = "action"

    def lookups(self, request, model_admin):
        return [(name, name) for name in sorted(registry.action_names())]


def exact_id_search(queryset, term: str, *, id_field: str, trace_field: str | None = None):
    """Search by an exact run id or trace id: an index lookup, never ``UPPER(..) LIKE '%q%'``."""
    term = term.strip()
    match = Q(**{trace_field: term}) if trace_field else Q(pk__in=[])
    try:
        match |= Q(**{id_field: uuid.UUID(term)})
    except ValueError:
        pass
    return queryset.filter(match)


@admin.register(Run)
class RunAdmin(HistoryAdminMixin, WorkspaceScopedAdmin):
    # Short cells, one line each, so the list fits a 1400 px window beside the nav and the filters.
    list_display = [
        "short_id",
        "automation_name",
        "run_status",
        "error_summary",
        "trigger",
        "created",
        "duration",
    ]
    list_display_links = ["short_id"]
    list_select_related = ["automation"]
    list_filter = ["status", TriggerTypeFilter, QueueFilter, "workspace"]
    # The run list's index order (run_created_idx); see get_search_results for the search.
    ordering = ["-created_at", "-id"]
    search_fields = ["id", "trace_id", "automation__name"]
    search_help_text = "a run id or trace id (exact), or the start of an automation's name"
    actions = ["cancel", "rerun", "resolve_succeeded", "resolve_retry", "resolve_failed"]
    readonly_fields = ["automation", "automation_version", "run_status", "links", "chain", "trigger_type", "trigger_key",
                       "triggered_by", "trace_id", "queue", "pretty_inputs", "pretty_output", "pretty_error",
                       "cost_usd", "created_at", "started_at", "finished_at", "duration", "timeline"]  # fmt: skip
    fields = readonly_fields
    change_form_template = "admin/automations/run/change_form.html"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_search_results(self, request, queryset, search_term):
        if not search_term.strip():
            return queryset, False
        term = search_term.strip()
        # Automations are few: resolve the name prefix to ids, then the runs by index.
        named = list(Automation.objects.filter(name__istartswith=term).values_list("pk", flat=True)[:100])
        exact = exact_id_search(queryset, term, id_field="pk", trace_field="trace_id")
        return exact | queryset.filter(automation_id__in=named), False

    # --- list columns ----------------------------------------------------------------

    @admin.display(description="run", ordering="id")
    def short_id(self, run: Run) -> str:
        return str(run.pk)[:8]

    @admin.display(description="status", ordering="status")
    def run_status(self, run: Run):
        if run.cancel_requested and run.status in ACTIVE_RUN_STATUSES:
            # The running step cannot be interrupted: the run stops when it returns.
            return format_html(
                '{} <i class="cancel-requested">(cancel requested)</i>', coloured_status(run.status)
            )
        return coloured_status(run.status)

    @admin.display(description="error")
    def error_summary(self, run: Run):
        text = error_text(run.error)
        if not text:
            return ""
        return _clipped(text, "12em")

    @admin.display(description="automation", ordering="automation__name")
    def automation_name(self, run: Run):
        return _clipped(run.automation.name, "12em")

    @admin.display(description="trigger", ordering="trigger_type")
    def trigger(self, run: Run) -> str:
        return run.trigger_type

    @admin.display(description="created", ordering="created_at")
    def created(self, run: Run) -> str:
        return timezone.localtime(run.created_at).strftime("%b %d %H:%M:%S")

    @admin.display(description="duration")
    def duration(self, run: Run) -> str:
        if run.started_at is None:
            return ""
        seconds = ((run.finished_at or timezone.now()) - run.started_at).total_seconds()
        text = f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
        return text if run.finished_at else f"{text} so far"

    # --- the run page ----------------------------------------------------------------

    @admin.display(description="inputs")
    def pretty_inputs(self, run: Run):
        return format_html("<pre>{}</pre>", _pretty(run.inputs))

    @admin.display(description="output")
    def pretty_output(self, run: Run):
        return format_html("<pre>{}</pre>", _pretty(run.output)) if run.output is not None else "-"

    @admin.display(description="error")
    def pretty_error(self, run: Run):
        return format_html("<pre>{}</pre>", _pretty(run.error)) if run.error else "-"

    @admin.display(description="see also")
    def links(self, run: Run):
        approvals = reverse("admin:approvals_approval_changelist") + f"?run_id={run.pk}&status__exact=all"
        trace = reverse("admin:audit_auditevent_changelist") + f"?trace_id={run.trace_id}"
        items = [(approvals, "approvals-link", "its approvals"), (trace, "trace-link", "its audit trace")]
        return format_html_join(" · ", '<a href="{}" id="{}">{}</a>', items)

    CHAIN_CHILDREN_SHOWN = 20

    @admin.display(description="chain")
    def chain(self, run: Run):
        """Its place in a chain of runs: depth, the run it came from and the runs it started, each a
        link. A re-run starts a trace of its own; a run started by another's event shares its trace.
        Chains stay in one workspace, which the user sees since they see this run."""

        def link(other: Run, attr: str, value: str):
            url = reverse("admin:automations_run_change", args=[other.pk])
            return format_html('<a href="{}" {}="{}">{}</a> {} {}', url, attr, value, str(other.pk)[:8],
                               other.automation.name, coloured_status(other.status))  # fmt: skip

        same_workspace = Run.objects.filter(workspace_id=run.workspace_id).select_related("automation")
        parts = [format_html('<span id="chain-depth">depth {}</span>', run.chain_depth)]
        if run.parent_run_id:
            parent = same_workspace.filter(pk=run.parent_run_id).first()
            if parent is None:
                parts.append(
                    format_html('<span id="parent-run">from run {}</span>', str(run.parent_run_id)[:8])
                )
            else:
                how = "re-run of" if parent.trace_id != run.trace_id else "started by an event of"
                parts.append(
                    format_html('<span id="parent-run">{} {}</span>', how, link(parent, "id", "parent-link"))
                )
        shown = self.CHAIN_CHILDREN_SHOWN
        children = list(same_workspace.filter(parent_run_id=run.pk).order_by("created_at", "id")[: shown + 1])
        rows = [(link(child, "class", "child-link"), "re-run" if child.trace_id != run.trace_id else "by event")
                for child in children[:shown]]  # fmt: skip
        more = ""
        if len(children) > shown:
            listing = reverse("admin:automations_run_changelist") + f"?parent_run={run.pk}"
            more = format_html(', <a href="{}" id="children-link">all of them</a>', listing)
        started = format_html_join(", ", "{} ({})", rows) if rows else "no run"
        parts.append(format_html('<span id="child-runs">started {}{}</span>', started, more))
        return format_html_join(" · ", "{}", ((part,) for part in parts))

    @admin.display(description="step timeline")
    def timeline(self, run: Run):
        rows = run.steps.order_by("-phase", "index")
        header = format_html(
            "<tr><th>phase</th><th>step</th><th>action</th><th>status</th><th>attempt</th>"
            "<th>started</th><th>duration ms</th><th>error</th><th>config (rendered, redacted)</th>"
            "<th>output</th></tr>"
        )
        body = format_html_join(
            "", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td><td>{}</td></tr>",
            ((s.phase, s.step_id, s.action, coloured_status(s.status), s.attempt, s.started_at or "",
              f"{s.duration_ms:.1f}" if s.duration_ms is not None else "",
              f"{s.error_code}: {s.error_message}" if s.error_code else "",
              _folded(s.rendered_config), _folded(s.output)) for s in rows),
        )  # fmt: skip
        return format_html('<table id="step-timeline">{}{}</table>', header, body)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        run = self.get_object(request, object_id)
        extra = {}
        if run is not None:
            may_operate = may_act(request.user, run.workspace_id, Permission.OPERATE)
            extra = {"may_cancel": may_operate and run.status in ACTIVE_RUN_STATUSES,
                     "may_rerun": may_operate and run.status not in ACTIVE_RUN_STATUSES,
                     "may_resolve": may_operate and run.status == RunStatus.NEEDS_ATTENTION}  # fmt: skip
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    def get_urls(self):
        return [
            path("<uuid:object_id>/cancel/", self.admin_site.admin_view(self.cancel_view), name="automations_run_cancel"),
            path("<uuid:object_id>/rerun/", self.admin_site.admin_view(self.rerun_view), name="automations_run_rerun"),
            path("<uuid:object_id>/resolve/", self.admin_site.admin_view(self.resolve_view),
                 name="automations_run_resolve"),
        ] + super().get_urls()  # fmt: skip

    def _operable(self, request, object_id) -> Run:
        """The run, if the user sees it (else 404); the role check is the service call's."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), pk=object_id)

    def _action_page(self, request, run: Run, form, title: str, button: str, danger: bool = False):
        context = {**self.admin_site.each_context(request), "opts": self.model._meta, "original": run,
                   "title": title, "form": form, "button": button, "danger": danger,
                   "run_url": reverse("admin:automations_run_change", args=[run.pk])}  # fmt: skip
        return TemplateResponse(request, "admin/automations/run/action.html", context)

    def _act(self, request, run: Run, fn, done: str):
        """Call the service; a refusal is a message on the run page, never a 500."""
        try:
            require_or_superuser(request.user, run.workspace_id, Permission.OPERATE)
            result = fn()
        except ServiceError as exc:
            self.message_user(request, f"run {str(run.pk)[:8]}: {exc.message}", messages.ERROR)
            return redirect("admin:automations_run_change", run.pk)
        self.message_user(request, done, messages.SUCCESS)
        target = result.pk if isinstance(result, Run) else run.pk
        return redirect("admin:automations_run_change", target)

    def cancel_view(self, request, object_id):
        run = self._operable(request, object_id)
        if request.method == "POST":
            return self._act(request, run, lambda: services.run_cancel(run=run, user=request.user),
                             f"run {str(run.pk)[:8]}: cancel requested")  # fmt: skip
        return self._action_page(request, run, None, f"Cancel run {str(run.pk)[:8]}?", "Yes, cancel the run",
                                 danger=True)  # fmt: skip

    def rerun_view(self, request, object_id):
        run = self._operable(request, object_id)
        form = RerunForm(request.POST if request.method == "POST" else None, run=run)
        if form.is_bound and form.is_valid():
            step = form.cleaned_data["from_step"] or None
            return self._act(request, run, lambda: services.run_rerun(run=run, user=request.user, from_step=step),
                             f"re-run of {str(run.pk)[:8]} queued" + (f" from step {step}" if step else ""))  # fmt: skip
        return self._action_page(request, run, form, f"Re-run run {str(run.pk)[:8]}", "Re-run")

    def resolve_view(self, request, object_id):
        run = self._operable(request, object_id)
        form = ResolveForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            data = form.cleaned_data
            return self._act(
                request, run,
                lambda: services.run_resolve(run=run, user=request.user, resolution=data["resolution"],
                                             reason=data["reason"], output=data["output"]),
                f"run {str(run.pk)[:8]}: resolved ({data['resolution']})",
            )  # fmt: skip
        return self._action_page(request, run, form, f"Resolve run {str(run.pk)[:8]}", "Resolve")

    # --- bulk actions (the same services; each run checked for the user's role) -----------

    def _each(self, request, queryset, label, fn):
        for run in queryset:
            try:
                require_or_superuser(request.user, run.workspace_id, Permission.OPERATE)
                fn(run)
            except ServiceError as exc:
                self.message_user(request, f"run {str(run.pk)[:8]}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"run {str(run.pk)[:8]}: {label}")

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
class StepRunAdmin(HistoryAdminMixin, WorkspaceScopedAdmin):
    workspace_lookup = "run__workspace"

    list_display = ["run", "step_id", "action", "status", "attempt", "started_at", "finished_at"]
    list_filter = ["status", ActionFilter]
    list_select_related = ["run"]
    # Newest first by primary key: the model's ordering goes through the run (a join and a
    # sort of every step).
    ordering = ["-id"]
    search_fields = ["run__id"]
    search_help_text = "a run id (exact): that run's steps"

    def get_search_results(self, request, queryset, search_term):
        if not search_term.strip():
            return queryset, False
        return exact_id_search(queryset, search_term, id_field="run_id"), False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history: the retention sweep prunes it, never a hand in the admin


@admin.register(DomainEvent)
class DomainEventAdmin(HistoryAdminMixin, WorkspaceScopedAdmin):
    list_display = ["event_type", "workspace", "source", "created_at", "chain_depth"]
    list_filter = ["workspace"]
    ordering = ["-created_at"]
    search_fields = ["event_type", "trace_id"]
    search_help_text = "an event type or a trace id (exact)"

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(event_type=term) | Q(trace_id=term)), False

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # history: the retention sweep prunes it, never a hand in the admin


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
