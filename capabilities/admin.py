"""Credentials (write-only), MCP servers (harvest now) and MCP tools (re-approve, set risk).

Every write calls the same service as the API, so it is validated and audited
the same way.
"""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.db.models import F
from django.utils.html import format_html

from workspaces.access import may_act, workspace_ids_for, workspaces_for
from workspaces.models import Permission

from . import credentials, mcp
from .models import Credential, CredentialKind, McpServer, McpTool, McpToolStatus, McpTransport, RiskLevel

WRITE_ONLY_HELP = (
    "Write-only: never shown again. bearer: the token; basic: the password; header: the header value; "
    "oauth2: the refresh token. Leave blank when editing to keep the current one."
)


def _secret_widget() -> forms.PasswordInput:
    # render_value=False: a re-displayed form (e.g. after a validation error) never echoes it.
    return forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"})


class WorkspaceAdministeredAdmin(admin.ModelAdmin):
    """Rows of the workspaces the user may view (superusers: all); adding, changing, deleting and the
    actions are the workspace ``admin``'s, as in the API (credentials, MCP servers and tools)."""

    workspace_lookup = "workspace"

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        if request.user.is_superuser:
            return queryset
        visible = workspace_ids_for(request.user, Permission.VIEW)
        return queryset.filter(**{f"{self.workspace_lookup}__in": visible})

    def workspace_id_of(self, obj) -> int:
        return obj.workspace_id

    def administers(self, request, obj) -> bool:
        return may_act(request.user, self.workspace_id_of(obj), Permission.ADMINISTER)

    def has_change_permission(self, request, obj=None):
        allowed = super().has_change_permission(request, obj)
        return allowed and (obj is None or self.administers(request, obj))

    def has_delete_permission(self, request, obj=None):
        allowed = super().has_delete_permission(request, obj)
        return allowed and (obj is None or self.administers(request, obj))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "workspace" and not request.user.is_superuser:
            kwargs["queryset"] = workspaces_for(request.user, Permission.ADMINISTER)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def refused(self, request, obj, label: str) -> bool:
        """True (and a message saying why) when the user may not act on ``obj``."""
        if self.administers(request, obj):
            return False
        self.message_user(request, f"{label}: your role in this workspace does not allow 'administer'",
                          messages.ERROR)  # fmt: skip
        return True


def changed_badge(tool: McpTool):
    """Words, not Django's boolean icons: a green tick would mark the rug-pulled tool as fine."""
    if tool.changed_since_approval:
        return format_html('<b style="color:#c62828">CHANGED — re-approve</b>')
    return "no"


class CredentialForm(forms.ModelForm):
    secret = forms.CharField(required=False, strip=False, widget=_secret_widget(), help_text=WRITE_ONLY_HELP)
    username = forms.CharField(required=False, help_text="basic only")
    client_secret = forms.CharField(required=False, strip=False, widget=_secret_widget(),
                                    help_text="oauth2 only, optional")  # fmt: skip
    access_token = forms.CharField(required=False, strip=False, widget=_secret_widget(),
                                   help_text="oauth2 only, optional (refreshed automatically)")  # fmt: skip
    metadata = forms.JSONField(required=False, initial=dict,
                               help_text='header: {"header_name": "X-Api-Key"}; oauth2: {"token_url": ..., '
                                         '"client_id": ..., "scopes": [...]}')  # fmt: skip

    allowed_destinations = forms.JSONField(required=False, initial=list,
                                           help_text='where it may be sent: ["api.example.com", "*.example.com", '
                                                     '"https://host/v1/"]; empty: nowhere')  # fmt: skip
    allowed_automations = forms.JSONField(required=False, initial=None,
                                          help_text="null: every automation of the workspace; or a list of ids")  # fmt: skip

    class Meta:
        model = Credential
        fields = ["workspace", "name", "kind", "metadata", "allowed_destinations", "allow_code_steps",
                  "allowed_automations", "approval_always"]  # fmt: skip
        help_texts = {"approval_always": "Every step that uses this credential asks a human, whatever the autonomy "
                                         "(a standing approval never covers it)."}  # fmt: skip

    def _secret_dict(self, kind: str) -> dict[str, str] | None:
        data = self.cleaned_data
        if not data.get("secret"):
            return None
        if kind == CredentialKind.BEARER:
            return {"token": data["secret"]}
        if kind == CredentialKind.BASIC:
            return {"username": data.get("username") or "", "password": data["secret"]}
        if kind == CredentialKind.HEADER:
            return {"value": data["secret"]}
        secret = {"refresh_token": data["secret"]}
        for key in ("client_secret", "access_token"):
            if data.get(key):
                secret[key] = data[key]
        return secret

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data  # what ModelForm.clean returns
        kind = self.instance.kind if self.instance.pk else cleaned.get("kind")
        if kind is None:
            return cleaned
        secret = self._secret_dict(kind)
        if secret is None and not self.instance.pk:
            self.add_error("secret", "a new credential needs its secret")
        try:
            if secret is not None:
                credentials.check_secret(kind, {k: v for k, v in secret.items() if v})
            credentials.check_metadata(kind, cleaned.get("metadata") or {})
            cleaned["grant"] = credentials.check_grant(
                {"allowed_destinations": cleaned.get("allowed_destinations") or [],
                 "allow_code_steps": bool(cleaned.get("allow_code_steps")),
                 "allowed_automations": cleaned.get("allowed_automations"),
                 "approval_always": bool(cleaned.get("approval_always"))}
            )  # fmt: skip
        except credentials.CredentialError as exc:
            raise forms.ValidationError(exc.message) from None
        cleaned["secret_dict"] = secret
        return cleaned


class CredentialUsedFilter(admin.SimpleListFilter):
    title = "used by an MCP server"
    parameter_name = "mcp"

    def lookups(self, request, model_admin):
        return [("yes", "yes"), ("no", "no")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(mcp_servers__isnull=False).distinct()
        if self.value() == "no":
            return queryset.filter(mcp_servers__isnull=True)
        return queryset


@admin.register(Credential)
class CredentialAdmin(WorkspaceAdministeredAdmin):
    form = CredentialForm
    list_display = ["name", "kind", "workspace", "approval_always", "updated_at", "created_by"]
    list_filter = ["kind", "workspace", "approval_always", CredentialUsedFilter]
    search_fields = ["name"]
    # encrypted_value is not a form field and not displayed anywhere.
    readonly_fields = ["created_at", "updated_at", "created_by"]

    def get_readonly_fields(self, request, obj=None):
        fixed = ["workspace", "name", "kind"] if obj else []
        return [*fixed, *self.readonly_fields]

    # The form's fields that only some kinds use; the add page shows the chosen kind's with a few
    # lines of JavaScript, the change page (kind fixed) lists only its kind's.
    KIND_FIELDS = {
        CredentialKind.BEARER: ["secret"],
        CredentialKind.BASIC: ["username", "secret"],
        CredentialKind.HEADER: ["secret", "metadata"],
        CredentialKind.OAUTH2: ["secret", "client_secret", "access_token", "metadata"],
    }
    KIND_SPECIFIC = {"secret", "username", "client_secret", "access_token", "metadata"}

    class Media:
        js = ["capabilities/credential_kind.js"]

    def get_fields(self, request, obj=None):
        fields = super().get_fields(request, obj)
        if obj is None:
            return fields
        keep = set(self.KIND_FIELDS.get(obj.kind, self.KIND_SPECIFIC))
        return [f for f in fields if f not in self.KIND_SPECIFIC or f in keep]

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            credentials.credential_update_secret(
                credential=obj,
                secret=data.get("secret_dict"),
                metadata=data.get("metadata") or {},
                grant=data["grant"],
                user=request.user,
            )
            return
        saved = credentials.credential_create(
            workspace=data["workspace"], name=data["name"], kind=data["kind"], secret=data["secret_dict"],
            metadata=data.get("metadata") or {}, user=request.user, **data["grant"],
        )  # fmt: skip
        obj.pk = saved.pk

    def delete_model(self, request, obj):
        try:
            credentials.credential_delete(credential=obj, user=request.user)
        except credentials.CredentialError as exc:
            self.message_user(request, exc.message, messages.ERROR)

    def delete_queryset(self, request, queryset):
        for credential in queryset:
            if not self.refused(request, credential, credential.name):
                self.delete_model(request, credential)


class McpServerForm(forms.ModelForm):
    command = forms.JSONField(
        required=False, initial=list, help_text='stdio: argv list, e.g. ["npx", "server"]'
    )
    env = forms.JSONField(required=False, initial=dict,
                          help_text='stdio: non-secret variables; "$credential" passes the credential\'s secret')  # fmt: skip

    class Meta:
        model = McpServer
        fields = ["workspace", "slug", "name", "transport", "url", "command", "env", "credential", "enabled"]

    user: AbstractBaseUser | AnonymousUser | None = None  # set by McpServerAdmin.get_form

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data  # what ModelForm.clean returns
        workspace = self.instance.workspace if self.instance.pk else cleaned.get("workspace")
        transport = self.instance.transport if self.instance.pk else cleaned.get("transport")
        if workspace is None or transport is None:
            return cleaned
        try:
            mcp.clean_server_fields(
                workspace=workspace, transport=transport, url=cleaned.get("url") or "",
                command=cleaned.get("command") or [], env=cleaned.get("env") or {},
                credential=cleaned.get("credential"), user=self.user,
            )  # fmt: skip
        except mcp.McpServiceError as exc:
            raise forms.ValidationError(exc.message) from None
        return cleaned


class McpToolInline(admin.TabularInline):
    model = McpTool
    extra = 0
    can_delete = False
    fields = readonly_fields = ("name", "status", "risk_override", "changed", "last_seen")
    show_change_link = True

    @admin.display(description="changed since approval")
    def changed(self, obj):
        return changed_badge(obj)

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(McpServer)
class McpServerAdmin(WorkspaceAdministeredAdmin):
    form = McpServerForm
    list_display = ["slug", "name", "workspace", "transport", "enabled", "last_harvested_at", "last_error"]
    list_filter = ["transport", "enabled", "workspace"]
    search_fields = ["slug", "name"]  # not the URL: a viewer could test guesses at a secret in it
    readonly_fields = ["last_harvested_at", "last_error", "created_at", "updated_at"]
    inlines = [McpToolInline]
    actions = ["harvest_now"]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        assert issubclass(form, McpServerForm)  # built from self.form
        form.user = request.user
        return form

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def get_readonly_fields(self, request, obj=None):
        fixed = ["workspace", "slug", "transport"] if obj else []
        viewer = obj is not None and not self.administers(request, obj)
        masked = ["url_masked", "env_masked", "command_masked"] if viewer else []
        return [*fixed, *masked, *self.readonly_fields]

    def get_fields(self, request, obj=None):
        """A non-admin sees env keys with masked values, the URL without userinfo or query values and
        the command with secret-looking flag values masked."""
        fields = super().get_fields(request, obj)
        if obj is not None and not self.administers(request, obj):
            masked = {"url": "url_masked", "env": "env_masked", "command": "command_masked"}
            return [masked.get(f, f) if isinstance(f, str) else f for f in fields]
        return fields

    @admin.display(description="URL")
    def url_masked(self, obj):
        return mcp.masked_url(obj.url)

    @admin.display(description="command")
    def command_masked(self, obj):
        return json.dumps(mcp.masked_command(obj.command))

    @admin.display(description="env")
    def env_masked(self, obj):
        return json.dumps(mcp.masked_env(obj.env))

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            mcp.mcp_server_update(
                server=obj, user=request.user, name=data.get("name", ""), url=data.get("url") or "",
                command=data.get("command") or [], env=data.get("env") or {}, credential=data.get("credential"),
                enabled=data.get("enabled", True),
            )  # fmt: skip
            return
        saved = mcp.mcp_server_create(
            workspace=data["workspace"], slug=data["slug"], name=data.get("name", ""),
            transport=data.get("transport", McpTransport.HTTP), url=data.get("url") or "",
            command=data.get("command") or [], env=data.get("env") or {}, credential=data.get("credential"),
            enabled=data.get("enabled", True), user=request.user,
        )  # fmt: skip
        obj.pk = saved.pk

    def save_related(self, request, form, formsets, change):
        """Tools are written by harvests, never edited through the server form."""

    def delete_model(self, request, obj):
        mcp.mcp_server_delete(server=obj, user=request.user)

    def get_deleted_objects(self, objs, request):
        """A server goes with its tools (the service deletes both); Django's own walk stops at the
        tools, which are never deleted by hand, and so refused to delete any server."""
        names = [f"{server} and its {server.tools.count()} tool(s)" for server in objs]
        refused = {"MCP server"} if any(not self.administers(request, server) for server in objs) else set()
        return names, {"MCP servers": len(names)}, refused, []

    def delete_queryset(self, request, queryset):
        for server in queryset:
            if not self.refused(request, server, server.slug):
                mcp.mcp_server_delete(server=server, user=request.user)

    @admin.action(description="Harvest now", permissions=["change"])
    def harvest_now(self, request, queryset):
        for server in queryset:
            if self.refused(request, server, server.slug):
                continue
            try:
                counts = mcp.mcp_harvest(server, user=request.user).counts()
            except mcp.McpServiceError as exc:
                self.message_user(request, f"{server.slug}: {exc.message}", messages.ERROR)
                continue
            level = messages.WARNING if counts["changed"] or counts["new"] else messages.SUCCESS
            self.message_user(request, f"{server.slug}: {counts}", level)


class NeedsReviewFilter(admin.SimpleListFilter):
    title = "needs review"
    parameter_name = "review"

    def lookups(self, request, model_admin):
        return [("yes", "new, changed since approval or disabled")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.exclude(schema_hash=F("approved_hash")) | queryset.filter(
                status=McpToolStatus.DISABLED
            )
        return queryset


@admin.register(McpTool)
class McpToolAdmin(WorkspaceAdministeredAdmin):
    list_display = ["capability", "workspace", "status_badge", "risk", "changed", "last_seen"]
    list_filter = [NeedsReviewFilter, "status", "risk_override", "server__workspace", "server"]
    search_fields = ["name", "server__slug", "description"]
    ordering = [
        "status",
        "server__slug",
        "name",
    ]  # "active" < "disabled" < "pending" < "removed"; filter to review
    readonly_fields = [
        "server", "name", "description", "input_schema", "output_schema", "annotations", "schema_hash",
        "approved_hash", "status", "risk_override", "first_seen", "last_seen",
    ]  # fmt: skip
    actions = ["reapprove", "risk_low", "risk_medium", "risk_high", "risk_critical", "risk_default"]

    workspace_lookup = "server__workspace"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("server", "server__workspace")

    def workspace_id_of(self, obj) -> int:
        return obj.server.workspace_id

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # removed tools stay on record

    def save_model(self, request, obj, form, change):
        """Every field is read-only: trust changes go through the audited actions only."""

    @admin.display(description="capability", ordering="name")
    def capability(self, obj):
        return mcp.capability_id(obj)

    @admin.display(description="workspace")
    def workspace(self, obj):
        return obj.server.workspace

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj):
        colour = {
            McpToolStatus.PENDING: "#c60",
            McpToolStatus.ACTIVE: "green",
            McpToolStatus.DISABLED: "#c00",
            McpToolStatus.REMOVED: "grey",
        }
        label = (
            obj.status.upper()
            if obj.status in (McpToolStatus.DISABLED, McpToolStatus.PENDING)
            else obj.status
        )
        return format_html('<b style="color:{}">{}</b>', colour.get(obj.status, "black"), label)

    @admin.display(description="risk")
    def risk(self, obj):
        return obj.risk_override or f"{RiskLevel.HIGH} (default)"

    @admin.display(description="changed since approval")
    def changed(self, obj):
        return changed_badge(obj)

    def _each(self, request, queryset, fn, done: str) -> None:
        count = 0
        for tool in queryset:
            if self.refused(request, tool, mcp.capability_id(tool)):
                continue
            try:
                fn(tool)
                count += 1
            except mcp.McpServiceError as exc:
                self.message_user(request, f"{mcp.capability_id(tool)}: {exc.message}", messages.ERROR)
        if count:
            self.message_user(request, f"{count} tool(s) {done}", messages.SUCCESS)

    @admin.action(description="Re-approve (trust the current definition)", permissions=["change"])
    def reapprove(self, request, queryset):
        self._each(request, queryset, lambda t: mcp.mcp_tool_approve(tool=t, user=request.user), "approved")

    def _set_risk(self, request, queryset, risk: str | None) -> None:
        self._each(request, queryset, lambda t: mcp.mcp_tool_set_risk(tool=t, risk=risk, user=request.user),
                   f"set to risk {risk or 'default (high)'}")  # fmt: skip

    @admin.action(description="Set risk: low", permissions=["change"])
    def risk_low(self, request, queryset):
        self._set_risk(request, queryset, RiskLevel.LOW)

    @admin.action(description="Set risk: medium", permissions=["change"])
    def risk_medium(self, request, queryset):
        self._set_risk(request, queryset, RiskLevel.MEDIUM)

    @admin.action(description="Set risk: high", permissions=["change"])
    def risk_high(self, request, queryset):
        self._set_risk(request, queryset, RiskLevel.HIGH)

    @admin.action(description="Set risk: critical", permissions=["change"])
    def risk_critical(self, request, queryset):
        self._set_risk(request, queryset, RiskLevel.CRITICAL)

    @admin.action(description="Clear risk override (back to high)", permissions=["change"])
    def risk_default(self, request, queryset):
        self._set_risk(request, queryset, None)
