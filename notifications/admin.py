"""Channels and deliveries in the admin. Every change goes through ``notifications.services``
(the same checks as the API: the workspace's admins only, URLs through the egress guard)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied

from config.errors import ServiceError
from workspaces.access import may_act, workspaces_for
from workspaces.models import Permission, Workspace

from . import services
from .models import Channel, ChannelKind, Delivery


def _scoped(request, queryset, permission: str = Permission.VIEW):
    if request.user.is_superuser:
        return queryset
    return queryset.filter(workspace__in=workspaces_for(request.user, permission).values("id"))


class ChannelForm(forms.ModelForm):
    to_text = forms.CharField(
        label="To", required=False, widget=forms.Textarea(attrs={"rows": 3, "cols": 60}),
        help_text="email: one address, role:approver or role:admin per line",
    )  # fmt: skip
    url_text = forms.CharField(
        label="URL", required=False, max_length=2000,
        help_text="slack: the incoming-webhook URL (stored encrypted); webhook: where signed JSON is POSTed",
    )  # fmt: skip

    class Meta:
        model = Channel
        fields = ["workspace", "kind", "name", "enabled"]

    def __init__(self, *args, request=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.request = request
        if self.instance.pk:
            if "to_text" in self.fields:
                self.fields["to_text"].initial = "\n".join(self.instance.to or [])
            if "url_text" in self.fields:
                self.fields["url_text"].help_text += " — leave empty to keep the current one"
            for name in ("workspace", "kind"):
                if name in self.fields:
                    self.fields[name].disabled = True
        elif request is not None and not request.user.is_superuser and "workspace" in self.fields:
            workspace_field = self.fields["workspace"]
            assert isinstance(workspace_field, forms.ModelChoiceField)
            workspace_field.queryset = workspaces_for(request.user, Permission.ADMINISTER)

    def _post_clean(self) -> None:
        """The service validates and saves (in ``clean``); the model's own checks would see its row."""

    def clean(self):
        data = super().clean() or {}
        to = [line.strip() for line in (data.get("to_text") or "").splitlines() if line.strip()]
        url = (data.get("url_text") or "").strip()
        user = self.request.user
        try:
            if self.instance.pk:
                changes: dict = {"name": data.get("name"), "enabled": data.get("enabled", True)}
                if self.instance.kind == ChannelKind.EMAIL:
                    changes["to"] = to
                elif url:
                    changes["url"] = url
                self._saved = services.channel_update(channel=self.instance, user=user, changes=changes,
                                                      superuser_ok=True)  # fmt: skip
                self._secret = None
            else:
                workspace: Workspace | None = data.get("workspace")
                if workspace is None:
                    return data
                kind = data.get("kind")
                self._saved, self._secret = services.channel_create(
                    workspace=workspace, user=user, kind=kind, name=data.get("name"),
                    to=to if kind == ChannelKind.EMAIL else None, url=url or None if kind != ChannelKind.EMAIL else None,
                    superuser_ok=True,
                )  # fmt: skip
        except ServiceError as exc:
            raise forms.ValidationError(exc.message)
        return data


@admin.register(Channel)
class ChannelAdmin(admin.ModelAdmin):
    form = ChannelForm
    list_display = ["name", "kind", "workspace", "destination", "enabled", "health", "last_success_at"]
    list_filter = ["kind", "enabled"]
    search_fields = ["name"]
    readonly_fields = [
        "consecutive_failures",
        "last_error",
        "last_failure_at",
        "last_success_at",
        "created_at",
    ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)

        class WithRequest(form):  # type: ignore[valid-type,misc]
            def __init__(self, *args, **inner):
                super().__init__(*args, request=request, **inner)

        return WithRequest

    def get_fields(self, request, obj=None):
        base = ["workspace", "kind", "name", "to_text", "url_text", "enabled"]
        return base + (self.readonly_fields if obj else [])

    def get_queryset(self, request):
        return _scoped(request, super().get_queryset(request).select_related("workspace"))

    def has_change_permission(self, request, obj=None):
        if obj is None:
            return True
        return may_act(request.user, obj.workspace_id, Permission.ADMINISTER)

    def has_delete_permission(self, request, obj=None):
        return self.has_change_permission(request, obj)

    def has_add_permission(self, request):
        return request.user.is_superuser or workspaces_for(request.user, Permission.ADMINISTER).exists()

    def save_form(self, request, form, change):
        return form._saved  # the service saved (and audited) it in the form's clean()

    def save_model(self, request, obj, form, change):
        if getattr(form, "_secret", None):
            messages.warning(
                request, f"The signing secret of {obj.name}, shown this once — copy it now: {form._secret}"
            )

    def save_related(self, request, form, formsets, change):
        pass

    def delete_model(self, request, obj):
        if not may_act(request.user, obj.workspace_id, Permission.ADMINISTER):
            raise PermissionDenied
        services.channel_delete(channel=obj, user=request.user, superuser_ok=True)

    def delete_queryset(self, request, queryset):
        for channel in queryset:
            self.delete_model(request, channel)

    @admin.display(description="to / url")
    def destination(self, obj: Channel) -> str:
        return ", ".join(obj.to) if obj.kind == ChannelKind.EMAIL else services.channel_url_hint(obj)

    @admin.display(description="health")
    def health(self, obj: Channel) -> str:
        if obj.failing:
            return f"failing ({obj.consecutive_failures} in a row): {obj.last_error[:120]}"
        return "ok"


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ["created_at", "notice", "kind", "address", "channel", "status", "attempts", "last_error"]
    list_filter = ["status", "notice", "kind"]
    search_fields = ["address", "approval__automation_name"]
    readonly_fields = ["approval", "workspace", "channel", "kind", "address", "user", "notice", "sequence",
                       "status", "attempts", "last_error", "created_at", "updated_at", "delivered_at"]  # fmt: skip
    fields = list(readonly_fields)

    def get_queryset(self, request):
        return _scoped(request, super().get_queryset(request).select_related("channel", "approval"))

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
