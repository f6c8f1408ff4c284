"""Shapes only. Credential serializers have no field that could carry a secret out."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import serializers

from .. import mcp
from ..credentials import NAME_PATTERN
from ..models import Credential, CredentialKind, McpServer, McpTool, McpToolStatus, McpTransport, RiskLevel

if TYPE_CHECKING:
    from workspaces.models import Workspace


class CredentialOut(serializers.ModelSerializer):
    """Never the secret. Metadata and grants only for operators and admins of the credential's
    workspace (``operated_workspaces`` in the context, when given); others see NAME_ONLY."""

    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = Credential
        # Deliberately explicit: encrypted_value is never serialised.
        fields = ["id", "name", "kind", "metadata", "allowed_destinations", "allow_code_steps",
                  "allowed_automations", "approval_always", "workspace", "created_at", "updated_at"]  # fmt: skip
        read_only_fields = fields

    NAME_ONLY = ("id", "name", "kind", "workspace")

    def to_representation(self, instance):
        data = super().to_representation(instance)
        operated = self.context.get("operated_workspaces")
        if operated is not None and instance.workspace_id not in operated:
            return {key: data[key] for key in self.NAME_ONLY}
        return data


class CredentialIn(serializers.Serializer):
    name = serializers.RegexField(
        NAME_PATTERN.pattern, help_text="letters, digits, '-' or '_', from a letter or digit"
    )
    kind = serializers.ChoiceField(choices=CredentialKind.choices)
    secret = serializers.DictField(child=serializers.CharField(trim_whitespace=False, max_length=16384))
    metadata = serializers.JSONField(required=False, default=dict)
    # drf-stubs type a JSONField's default as a mapping; any JSON value is valid.
    allowed_destinations = serializers.JSONField(required=False, default=list)  # type: ignore[arg-type]
    allow_code_steps = serializers.BooleanField(required=False, default=False)
    allowed_automations = serializers.JSONField(required=False, default=None)
    approval_always = serializers.BooleanField(
        required=False, default=False, help_text="every step that uses it asks a human"
    )
    workspace = serializers.SlugField(required=False)


class CredentialSecretIn(serializers.Serializer):
    secret = serializers.DictField(
        child=serializers.CharField(trim_whitespace=False, max_length=16384), required=False
    )
    metadata = serializers.JSONField(required=False)
    allowed_destinations = serializers.JSONField(required=False)
    allow_code_steps = serializers.BooleanField(required=False)
    allowed_automations = serializers.JSONField(required=False)
    approval_always = serializers.BooleanField(
        required=False, help_text="every step that uses it asks a human"
    )


class McpServerOut(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    credential: serializers.SlugRelatedField[Credential] = serializers.SlugRelatedField(
        slug_field="name", read_only=True
    )

    class Meta:
        model = McpServer
        fields = [
            "id", "slug", "name", "workspace", "transport", "url", "command", "env", "credential", "enabled",
            "last_harvested_at", "last_error", "created_at", "updated_at",
        ]  # fmt: skip
        read_only_fields = fields

    def to_representation(self, instance):
        """Admins of the server's workspace see it all; anyone else its env keys (values masked), its
        URL with userinfo and query values masked and its command with secret-looking flag values
        masked: each can hold a literal secret."""
        data = super().to_representation(instance)
        administered = self.context.get("administered_workspaces")
        if administered is None or instance.workspace_id not in administered:
            data["url"] = mcp.masked_url(data["url"])
            data["env"] = mcp.masked_env(data["env"])
            data["command"] = mcp.masked_command(data["command"])
        return data


class McpServerIn(serializers.Serializer):
    slug = serializers.CharField(max_length=64)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")
    transport = serializers.ChoiceField(choices=McpTransport.choices, default=McpTransport.HTTP)
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    command = serializers.ListField(
        child=serializers.CharField(max_length=4096), required=False, default=list
    )
    env = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=4096), required=False,
                                default=dict)  # fmt: skip
    credential = serializers.CharField(max_length=100, required=False, allow_null=True, default=None)
    enabled = serializers.BooleanField(required=False, default=True)
    workspace = serializers.SlugField(required=False)


class McpServerPatch(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    url = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    command = serializers.ListField(child=serializers.CharField(max_length=4096), required=False)
    env = serializers.DictField(
        child=serializers.CharField(allow_blank=True, max_length=4096), required=False
    )
    credential = serializers.CharField(max_length=100, required=False, allow_null=True)
    enabled = serializers.BooleanField(required=False)


class McpToolOut(serializers.ModelSerializer):
    server: serializers.SlugRelatedField[McpServer] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    capability_id = serializers.SerializerMethodField()
    risk = serializers.SerializerMethodField()
    changed_since_approval = serializers.BooleanField(read_only=True)

    class Meta:
        model = McpTool
        fields = [
            "id", "server", "capability_id", "name", "description", "input_schema", "output_schema", "annotations",
            "status", "risk", "risk_override", "schema_hash", "approved_hash", "changed_since_approval",
            "first_seen", "last_seen",
        ]  # fmt: skip
        read_only_fields = fields

    def get_capability_id(self, tool: McpTool) -> str:
        return f"{tool.server.slug}.{tool.name}"

    def get_risk(self, tool: McpTool) -> str:
        return tool.risk_override or RiskLevel.HIGH


class McpToolQuery(serializers.Serializer):
    status = serializers.ChoiceField(choices=McpToolStatus.choices, required=False, allow_blank=True)


class McpToolPatch(serializers.Serializer):
    risk_override = serializers.ChoiceField(choices=RiskLevel.choices, allow_null=True)


class HarvestOut(serializers.Serializer):
    new = serializers.IntegerField()
    changed = serializers.IntegerField()
    removed = serializers.IntegerField()
    restored = serializers.IntegerField()
    unchanged = serializers.IntegerField()


class ActionOut(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField()
    config_schema = serializers.JSONField(help_text="JSON Schema of the step's config")


class CapabilityOut(serializers.Serializer):
    id = serializers.CharField()
    description = serializers.CharField()
    input_schema = serializers.JSONField()
    output_schema = serializers.JSONField()
    side_effects = serializers.ListField(child=serializers.CharField())
    risk = serializers.CharField()
    idempotent = serializers.BooleanField()
    expected_duration_seconds = serializers.FloatField()
    workspace = serializers.CharField(allow_null=True, help_text="null for built-in capabilities")


class _Page(serializers.Serializer):
    """The list shape of SPEC §11; these lists are short and always come whole."""

    count = serializers.IntegerField()
    next = serializers.CharField(allow_null=True)
    previous = serializers.CharField(allow_null=True)


class ActionPage(_Page):
    results = ActionOut(many=True)


class CapabilityPage(_Page):
    results = CapabilityOut(many=True)
