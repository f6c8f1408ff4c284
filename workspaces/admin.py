"""Workspaces and their members in the admin: roles, four-eyes, default autonomy, the ceilings
(max autonomy, min approvals) and the egress allowlist.

Every write goes through ``workspaces.services`` (audited); a workspace is managed by its
``admin`` members (and superusers), and only superusers create workspaces.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError

from audit import writer
from config.errors import ServiceError

from . import api_tokens, services
from .access import may_act, workspace_ids_for
from .models import MAX_APPROVALS, ApiToken, Autonomy, Membership, Permission, Role, Workspace


class WorkspaceForm(forms.ModelForm):
    egress_allowlist = forms.JSONField(
        required=False, initial=list,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 60, "style": "font-family: monospace"}),
        help_text='Private hosts or CIDRs http_request may reach, as a JSON list, e.g. ["10.0.0.0/8", "intranet.local"].',
    )  # fmt: skip

    # Not required: a form posted without them (an older page, a script) leaves them as they are.
    max_autonomy = forms.ChoiceField(choices=[("", "(unchanged)"), *Autonomy.choices], required=False,
                                     help_text="")  # fmt: skip
    min_approvals = forms.IntegerField(required=False, min_value=1, max_value=MAX_APPROVALS)
    policies = forms.JSONField(
        required=False, initial=list,
        widget=forms.Textarea(attrs={"rows": 8, "cols": 80, "style": "font-family: monospace"}),
        help_text='Argument policies, tried in order, first match wins: a JSON list of {"when": <filter over the '
                  'step\'s rendered config>, "then": "auto" | "ask" | "block", "reason": "..."}, e.g. '
                  '[{"when": {"path": "json.amount", "gt": 500}, "then": "block", "reason": "refunds over 500"}].',
    )  # fmt: skip
    quiet_hours = forms.JSONField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80, "style": "font-family: monospace"}),
        help_text='Medium and higher risk steps ask inside this window, e.g. '
                  '{"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}; empty for none.',
    )  # fmt: skip

    class Meta:
        model = Workspace
        fields = [
            "slug",
            "name",
            "four_eyes",
            "default_autonomy",
            "max_autonomy",
            "min_approvals",
            "egress_allowlist",
            "policies",
            "quiet_hours",
        ]
        help_texts = {"default_autonomy": "For automations whose definition sets no execution.autonomy; "
                                          "read each time a step is gated, so it applies to their next steps.",
                      "max_autonomy": "The ceiling: no step here is gated above it, whatever its definition "
                                      "says (an operator's A4 is gated at this row). Read each time a step is gated.",
                      "min_approvals": "The fewest distinct approvers any gated step here needs (1 to 5), "
                                       "whatever its approvals_required says."}  # fmt: skip

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in ("max_autonomy", "min_approvals"):
            self.fields[name].help_text = self.Meta.help_texts[name]
            self.fields[name].initial = getattr(self.instance, name)

    def clean_min_approvals(self):
        value = self.cleaned_data.get("min_approvals")
        return None if value is None else _checked(services.min_approvals_check, value)

    def clean_egress_allowlist(self):
        value = self.cleaned_data.get("egress_allowlist")
        return _checked(services.egress_allowlist_check, [] if value in (None, "") else value)

    def clean_policies(self):
        value = self.cleaned_data.get("policies")
        return _checked(services.policies_check, [] if value in (None, "") else value)

    def clean_quiet_hours(self):
        value = self.cleaned_data.get("quiet_hours")
        return _checked(services.quiet_hours_check, None if value in (None, "") else value, with_paths=True)


def _checked(check, value, *, with_paths: bool = False):
    """The service's check of one field, its refusal shown on the form (the same rules as the API)."""
    try:
        return check(value)
    except ServiceError as exc:
        errors = exc.errors or []
        messages = [f"{e['path']}: {e['message']}" if with_paths else e["message"] for e in errors]
        raise ValidationError(messages or exc.message) from None


class MembershipFormSet(forms.BaseInlineFormSet):
    def clean(self):
        """A workspace that has an admin keeps one: checked on the whole page, before anything is saved."""
        super().clean()
        instance = self.instance
        if instance.pk is None or not Membership.objects.filter(workspace=instance, role=Role.ADMIN).exists():
            return
        admins = 0
        for form in self.forms:
            if not hasattr(form, "cleaned_data") or not form.cleaned_data:
                continue
            if form.cleaned_data.get("DELETE"):
                continue
            admins += form.cleaned_data.get("role") == Role.ADMIN
        if admins == 0:
            raise ValidationError(
                "A workspace keeps at least one admin: make someone else admin before removing or demoting "
                "the last one (LAST_ADMIN).",
                code="LAST_ADMIN",
            )


class MembershipInline(admin.TabularInline):
    model = Membership
    formset = MembershipFormSet
    extra = 1
    fields = ["user", "role"]

    def _administers(self, request, obj) -> bool:
        return obj is not None and may_act(request.user, obj.pk, Permission.ADMINISTER)

    def has_view_permission(self, request, obj=None):
        return True  # part of the workspace page: whoever sees the workspace sees who is in it

    def has_add_permission(self, request, obj=None):
        return self._administers(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._administers(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._administers(request, obj)


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    form = WorkspaceForm
    list_display = [
        "slug",
        "name",
        "four_eyes",
        "default_autonomy",
        "max_autonomy",
        "min_approvals",
        "members",
        "created_at",
    ]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        return queryset.filter(pk__in=workspace_ids_for(request.user, Permission.VIEW))

    def get_readonly_fields(self, request, obj=None):
        return ["slug"] if obj is not None else []

    @admin.display(description="members")
    def members(self, workspace: Workspace) -> int:
        return workspace.memberships.count()

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        if obj is None:
            return super().has_change_permission(request)
        return may_act(request.user, obj.pk, Permission.ADMINISTER)

    def has_delete_permission(self, request, obj=None):
        return False  # everything in the platform belongs to a workspace

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if not change:
            created = services.workspace_get_or_create(slug=data["slug"], name=data["name"],
                                                       actor=writer.actor_for(request.user))  # fmt: skip
            obj.pk = created.pk
        workspace = Workspace.objects.get(pk=obj.pk)
        services.workspace_update(workspace=workspace, user=request.user, name=data["name"],
                                  four_eyes=data["four_eyes"], egress_allowlist=data["egress_allowlist"],
                                  default_autonomy=data["default_autonomy"],
                                  max_autonomy=data.get("max_autonomy") or None,
                                  min_approvals=data.get("min_approvals"), policies=data["policies"],
                                  quiet_hours=data["quiet_hours"])  # fmt: skip
        obj.refresh_from_db()

    def save_formset(self, request, form, formset, change):
        """Members are added, re-roled and removed through the services, each audited."""
        actor = writer.actor_for(request.user)
        workspace = Workspace.objects.get(pk=form.instance.pk)
        formset.save(commit=False)
        for removed in formset.deleted_objects:
            services.membership_remove(membership=removed, actor=actor)
        for membership in [*formset.new_objects, *(obj for obj, _ in formset.changed_objects)]:
            services.membership_set_role(
                workspace=workspace, user=membership.user, role=membership.role, actor=actor
            )
        if formset.deleted_objects or formset.new_objects or formset.changed_objects:
            self.message_user(request, "members updated (each change is in the audit log)", messages.SUCCESS)


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """API tokens: listed and revoked here, never shown (only their sha256 is stored) and never
    made here: ``manage.py create_api_token`` or ``POST /api/v1/tokens`` make them and show the
    token once. A superuser sees everyone's tokens; anyone else with the view permission their own."""

    list_display = ["name", "user", "shown_prefix", "scope", "created_at", "expires_at", "last_used_at"]
    list_filter = ["scope"]
    search_fields = ["name", "prefix", "user__username"]
    fields = readonly_fields = (
        "user",
        "name",
        "shown_prefix",
        "scope",
        "created_at",
        "expires_at",
        "last_used_at",
    )
    actions = ["revoke"]

    def get_queryset(self, request):
        queryset = super().get_queryset(request).select_related("user")
        return queryset if request.user.is_superuser else queryset.filter(user=request.user)

    @admin.display(description="prefix")
    def shown_prefix(self, token: ApiToken) -> str:
        return f"{token.prefix}…"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # "Revoke" (audited) instead of a raw delete

    @admin.action(description="Revoke selected API tokens")
    def revoke(self, request, queryset):
        actor = writer.actor_for(request.user)
        tokens = list(queryset)
        for token in tokens:
            api_tokens.token_revoke(token=token, actor=actor)
        self.message_user(request, f"{len(tokens)} API token(s) revoked.", messages.SUCCESS)
