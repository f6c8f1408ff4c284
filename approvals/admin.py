"""Approvals in the admin: a pending count, approve/deny on the list and the detail page.

Every decision goes through ``services.approval_decide`` — the same checks
(role, four-eyes, quorum, races) as the API and the one-click link.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from config.errors import ServiceError
from workspaces.access import has_permission, workspaces_for
from workspaces.models import Permission

from . import selectors, services
from .gate import standing_signature_valid
from .models import Approval, ApprovalDecision, ApprovalStatus, Decision, StandingApproval


class DenyForm(forms.Form):
    reason = forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "cols": 80}), max_length=2000, strip=True,
                             help_text="Required: tell the requester why.")  # fmt: skip


class StatusFilter(admin.SimpleListFilter):
    """Status, defaulting to Pending (what an approver opens the list for); "All" is explicit.

    The parameter is the field lookup ``status__exact``, so links like the home page's keep working.
    """

    title = "status"
    parameter_name = "status__exact"
    ALL = "all"

    def lookups(self, request, model_admin):
        return [*ApprovalStatus.choices, (self.ALL, "All")]

    def value(self):
        return super().value() or ApprovalStatus.PENDING

    def queryset(self, request, queryset):
        return queryset if self.value() == self.ALL else queryset.filter(status=self.value())

    def choices(self, changelist):
        for lookup, title in self.lookup_choices:
            yield {
                "selected": self.value() == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }


def what_summary(approval: Approval) -> str:
    """One line of what will run: the action and its rendered payload, shortened."""
    text = json.dumps(approval.what, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return f"{approval.action}: {text[:100]}{'…' if len(text) > 100 else ''}"


def _scoped(request, queryset):
    if request.user.is_superuser:
        return queryset
    return queryset.filter(workspace__in=workspaces_for(request.user, Permission.VIEW).values("id"))


class DecisionInline(admin.TabularInline):
    model = ApprovalDecision
    extra = 0
    can_delete = False
    fields = ["user", "decision", "reason", "via", "created_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    list_display = ["status", "risk", "automation_name", "step_id", "will_run", "requested_by", "progress",
                    "expires_at", "created_at"]  # fmt: skip
    list_filter = [StatusFilter, "risk"]
    search_fields = ["automation_name", "step_id", "run_id", "requested_by"]
    ordering = ["-created_at"]
    actions = ["approve_selected", "deny_selected"]
    inlines = [DecisionInline]
    change_form_template = "admin/approvals/approval/change_form.html"
    fields = ["status", "workspace", "automation_name", "automation_id", "run_id", "step_id", "action",
              "capability_id", "risk", "why", "message", "pretty_what", "requested_by", "approvals_required",
              "expires_at", "created_at", "decided_at", "plan_hash", "answer", "edited_by"]  # fmt: skip
    readonly_fields = fields

    def get_queryset(self, request):
        return _scoped(request, selectors.with_counts(super().get_queryset(request)))

    def get_list_filter(self, request):
        # Listing every workspace as a filter would name workspaces the user is not in.
        return [*self.list_filter, "workspace"] if request.user.is_superuser else self.list_filter

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="approvals")
    def progress(self, obj):
        return f"{getattr(obj, 'approvals_count', 0)}/{obj.approvals_required}"

    @admin.display(description="what will run")
    def will_run(self, obj):
        return format_html('<code style="white-space:normal">{}</code>', what_summary(obj))

    @admin.display(description="what will run")
    def pretty_what(self, obj):
        text = json.dumps(obj.what, indent=2, sort_keys=True, ensure_ascii=False)
        return format_html('<pre id="approval-what" style="max-height:30em;overflow:auto">{}</pre>', text)

    def changelist_view(self, request, extra_context=None):
        pending = selectors.pending_count(request.user)
        title = f"Approvals — {pending} pending"
        return super().changelist_view(request, {**(extra_context or {}), "title": title})

    def change_view(self, request, object_id, form_url="", extra_context=None):
        approval = self.get_object(request, object_id)
        extra = {"may_decide": False, "why_not": ""}
        if approval is not None and approval.status == ApprovalStatus.PENDING:
            if not has_permission(request.user, approval.workspace_id, Permission.APPROVE):
                extra["why_not"] = "your role in this workspace does not allow approving"
            elif (
                refusal := services.approval_decide_refusal(approval=approval, user=request.user)
            ) is not None:
                extra["why_not"] = refusal.message
            else:
                extra["may_decide"] = True
        if approval is not None and approval.action == services.QUESTION_ACTION:
            question = approval.what if isinstance(approval.what, dict) else {}
            extra["question"] = {
                "text": question.get("question", ""),
                "options": [o for o in question.get("options") or () if isinstance(o, dict)],
                "allow_freetext": bool(question.get("allow_freetext")),
                "typed": "input_schema" in question and not question.get("options"),
                "on_timeout": question.get("on_timeout"),
            }
        if extra["may_decide"] and approval is not None and approval.action != services.QUESTION_ACTION:
            extra["edit_what"] = json.dumps(approval.what, indent=2, sort_keys=True)  # the edit form's start
        return super().change_view(request, object_id, form_url, {**(extra_context or {}), **extra})

    # --- deciding ---------------------------------------------------------------

    def _decide(self, request, approval_id, decision: str, reason: str = "") -> bool:
        try:
            approval = services.approval_decide(approval_id=approval_id, user=request.user, decision=decision,
                                                reason=reason, via="admin")  # fmt: skip
        except services.ApprovalError as exc:
            self.message_user(request, f"{approval_id}: {exc.message}", messages.ERROR)
            return False
        self.message_user(request, f"{approval.automation_name} / {approval.step_id}: now {approval.status}",
                          messages.SUCCESS)  # fmt: skip
        return True

    @admin.action(description="Approve selected approvals")
    def approve_selected(self, request, queryset):
        for approval_id in queryset.values_list("pk", flat=True):
            self._decide(request, approval_id, Decision.APPROVE)

    @admin.action(description="Deny selected approvals (asks for a reason)")
    def deny_selected(self, request, queryset):
        form = DenyForm(request.POST if "apply" in request.POST else None)
        if form.is_bound and form.is_valid():
            for approval_id in queryset.values_list("pk", flat=True):
                self._decide(request, approval_id, Decision.DENY, form.cleaned_data["reason"])
            return None
        context = {
            **self.admin_site.each_context(request),
            "title": "Deny approvals",
            "opts": self.model._meta,
            "form": form,
            "approvals": queryset,
            "selected": request.POST.getlist(admin.helpers.ACTION_CHECKBOX_NAME),
            "action": "deny_selected",
        }
        return TemplateResponse(request, "admin/approvals/approval/deny.html", context)

    def get_urls(self):
        extra = [
            path("<uuid:object_id>/approve/", self.admin_site.admin_view(self.approve_view),
                 name="approvals_approval_approve"),
            path("<uuid:object_id>/deny/", self.admin_site.admin_view(self.deny_view), name="approvals_approval_deny"),
            path("<uuid:object_id>/answer/", self.admin_site.admin_view(self.answer_view),
                 name="approvals_approval_answer"),
            path("<uuid:object_id>/edit/", self.admin_site.admin_view(self.edit_view),
                 name="approvals_approval_edit"),
        ]  # fmt: skip
        return extra + super().get_urls()

    def _visible(self, request, object_id) -> Approval:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return get_object_or_404(self.get_queryset(request), pk=object_id)

    def _back(self, approval: Approval):
        return HttpResponseRedirect(reverse("admin:approvals_approval_change", args=[approval.pk]))

    def approve_view(self, request, object_id):
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        approval = self._visible(request, object_id)
        self._decide(request, approval.pk, Decision.APPROVE)
        return self._back(approval)

    def edit_view(self, request, object_id):
        """Edit, then approve: the whole config (JSON) to run instead, through the API's service."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        approval = self._visible(request, object_id)
        try:
            edited = json.loads(request.POST.get("edited_config", ""))
        except ValueError:
            self.message_user(request, "the edited config must be JSON", messages.ERROR)
            return self._back(approval)
        if not isinstance(edited, dict):
            self.message_user(request, "the edited config must be a JSON object: the step's whole config",
                              messages.ERROR)  # fmt: skip
            return self._back(approval)
        try:
            approval = services.approval_decide(approval_id=approval.pk, user=request.user, decision=Decision.APPROVE,
                                                via="admin", edited_config=edited)  # fmt: skip
        except ServiceError as exc:
            problems = "; ".join(f"{e['path']}: {e['message']}" for e in exc.errors or ()) or exc.message
            self.message_user(request, f"not approved: {problems}"[:1000], messages.ERROR)
        else:
            self.message_user(request, f"{approval.automation_name} / {approval.step_id}: edited, now "
                              f"{approval.status} ({approval.approvals_required} approver(s) needed)", messages.SUCCESS)  # fmt: skip
        return self._back(approval)

    def answer_view(self, request, object_id):
        """An ask_human question's answer: an option (its index in the question, so a value keeps its
        JSON type), a typed JSON value when the question has an input schema, and/or free text."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        approval = self._visible(request, object_id)
        question = approval.what if isinstance(approval.what, dict) else {}
        options = [o for o in question.get("options") or () if isinstance(o, dict)]
        value = None
        raw = request.POST.get("option", "")
        if raw.isdigit() and int(raw) < len(options):
            value = options[int(raw)].get("value")
        elif request.POST.get("value", "").strip():
            try:
                value = json.loads(request.POST["value"])
            except ValueError:
                self.message_user(request, 'the value must be JSON (e.g. 7, "text", true)', messages.ERROR)
                return self._back(approval)
        try:
            answered = services.approval_answer(approval_id=approval.pk, user=request.user, value=value,
                                                freetext=request.POST.get("freetext", ""), via="admin")  # fmt: skip
        except services.ApprovalError as exc:
            self.message_user(request, exc.message, messages.ERROR)
        else:
            self.message_user(request, f"{answered.automation_name} / {answered.step_id}: answered {value!r}",
                              messages.SUCCESS)  # fmt: skip
        return self._back(approval)

    def deny_view(self, request, object_id):
        approval = self._visible(request, object_id)
        form = DenyForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            self._decide(request, approval.pk, Decision.DENY, form.cleaned_data["reason"])
            return self._back(approval)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Deny {approval.automation_name} / {approval.step_id}",
            "opts": self.model._meta,
            "form": form,
            "approvals": [approval],
            "original": approval,
        }
        return TemplateResponse(request, "admin/approvals/approval/deny.html", context)


class StandingApprovalForm(forms.ModelForm):
    arg_constraint = forms.JSONField(required=False, widget=forms.Textarea(attrs={"rows": 8, "cols": 80}),
                                     help_text="JSON Schema the step's rendered config must match; empty: any.")  # fmt: skip

    class Meta:
        model = StandingApproval
        fields = [
            "workspace",
            "automation_id",
            "capability_id",
            "max_uses",
            "expires_at",
            "arg_constraint",
            "reason",
        ]

    def clean(self):
        cleaned = super().clean()
        workspace = cleaned.get("workspace")
        if workspace is not None and not has_permission(self.user, workspace.id, Permission.APPROVE):
            raise forms.ValidationError("you may not approve in this workspace")
        if all(
            cleaned.get(name) is not None
            for name in ("automation_id", "capability_id", "max_uses", "expires_at")
        ):
            try:
                services.standing_approval_validate(
                    automation_id=cleaned["automation_id"], capability_id=cleaned["capability_id"],
                    max_uses=cleaned["max_uses"], expires_at=cleaned["expires_at"],
                    arg_constraint=cleaned.get("arg_constraint"),
                )  # fmt: skip
            except services.ApprovalError as exc:
                raise forms.ValidationError(exc.message) from None
        return cleaned


@admin.register(StandingApproval)
class StandingApprovalAdmin(admin.ModelAdmin):
    form = StandingApprovalForm
    list_display = ["capability_id", "automation_id", "automation_version", "workspace", "uses", "max_uses",
                    "expires_at", "revoked", "signature_ok", "binding", "created_by"]  # fmt: skip
    list_filter = ["revoked", "capability_id"]
    search_fields = ["automation_id", "capability_id"]
    actions = ["revoke_selected"]

    def get_queryset(self, request):
        return _scoped(request, super().get_queryset(request))

    def get_list_filter(self, request):
        return [*self.list_filter, "workspace"] if request.user.is_superuser else self.list_filter

    def has_change_permission(self, request, obj=None):
        # Bounds are signed at creation: a standing approval is revoked and replaced, never edited.
        return obj is None and super().has_change_permission(request, obj)

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return [f.name for f in StandingApproval._meta.fields] + ["signature_ok", "binding"]

    def has_delete_permission(self, request, obj=None):
        return False

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change, **kwargs)
        form.user = request.user
        return form

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "workspace":
            kwargs["queryset"] = workspaces_for(request.user, Permission.APPROVE)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    @admin.display(boolean=True, description="signature valid")
    def signature_ok(self, obj):
        return standing_signature_valid(obj)

    @admin.display(description="state")
    def binding(self, obj):
        """ "active", or why it covers nothing now: "void since version N" after an edit, a retired key..."""
        return services.standing_approval_state(obj)["state"]

    def save_model(self, request, obj, form, change):
        if change:
            raise PermissionDenied("standing approvals cannot be edited; revoke and create a new one")
        data = form.cleaned_data
        try:
            created = services.standing_approval_create(
                workspace=data["workspace"], automation_id=data["automation_id"], capability_id=data["capability_id"],
                max_uses=data["max_uses"], expires_at=data["expires_at"], user=request.user,
                arg_constraint=data.get("arg_constraint"), reason=data.get("reason", ""),
            )  # fmt: skip
        except services.ApprovalError as exc:
            raise PermissionDenied(exc.message) from None
        obj.pk = created.pk

    @admin.action(description="Revoke selected standing approvals")
    def revoke_selected(self, request, queryset):
        for standing in queryset:
            try:
                services.standing_approval_revoke(standing_id=standing.pk, user=request.user)
            except services.ApprovalError as exc:
                self.message_user(request, f"{standing.pk}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{standing.pk}: revoked")
