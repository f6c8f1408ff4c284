from __future__ import annotations

from rest_framework import serializers

from ..api_tokens import MAX_NAME_LENGTH
from ..models import MAX_APPROVALS, ApiToken, Autonomy, Membership, Role, TokenScope, Workspace


class WorkspaceOut(serializers.ModelSerializer):
    class Meta:
        model = Workspace
        fields = [
            "slug",
            "name",
            "four_eyes",
            "egress_allowlist",
            "default_autonomy",
            "max_autonomy",
            "min_approvals",
            "policies",
            "quiet_hours",
            "created_at",
        ]


class WorkspaceListOut(serializers.ModelSerializer):
    role = serializers.CharField(help_text="your role in it")

    class Meta:
        model = Workspace
        fields = ["slug", "name", "role"]


class WorkspaceCreate(serializers.Serializer):
    slug = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class WorkspacePatch(serializers.Serializer):
    name = serializers.CharField(max_length=200, required=False)
    four_eyes = serializers.BooleanField(required=False)
    egress_allowlist = serializers.JSONField(required=False, help_text="host names, IP addresses or CIDRs")
    default_autonomy = serializers.ChoiceField(
        choices=Autonomy.values, required=False,
        help_text="the gate row of automations here whose definition sets no execution.autonomy",
    )  # fmt: skip
    max_autonomy = serializers.ChoiceField(
        choices=Autonomy.values, required=False,
        help_text="the ceiling: no step here is gated above it, whatever its definition says (admins only)",
    )  # fmt: skip
    min_approvals = serializers.IntegerField(
        min_value=1, max_value=MAX_APPROVALS, required=False,
        help_text="the fewest distinct approvers any gated step here needs (admins only)",
    )  # fmt: skip

    def to_internal_value(self, data):
        # A JSON true or "2" is not a count of approvers (DRF's IntegerField would take "2").
        value = data.get("min_approvals") if isinstance(data, dict) else None
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise serializers.ValidationError({"min_approvals": ["a whole number from 1 to 5"]})
        return super().to_internal_value(data)

    policies = serializers.JSONField(
        required=False, help_text="ordered argument rules {when, then: auto|ask|block, reason}; first match wins",
    )  # fmt: skip
    quiet_hours = serializers.JSONField(
        required=False, allow_null=True,
        help_text='{"start": "HH:MM", "end": "HH:MM", "timezone": "Area/City"}, or null for none',
    )  # fmt: skip


class MemberOut(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role"]


class MemberIn(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Role.choices)


class MemberRemove(serializers.Serializer):
    username = serializers.CharField(max_length=150)


class ApiTokenOut(serializers.ModelSerializer):
    prefix = serializers.CharField(help_text="the token's first characters, to tell it apart (not usable)")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "scope", "created_at", "expires_at", "last_used_at"]


class ApiTokenCreated(ApiTokenOut):
    token = serializers.CharField(help_text="the token: shown this once, only its sha256 is stored")

    class Meta(ApiTokenOut.Meta):
        fields = [*ApiTokenOut.Meta.fields, "token"]


class ApiTokenIn(serializers.Serializer):
    name = serializers.CharField(
        max_length=MAX_NAME_LENGTH, required=False, help_text="default 'token', 'token-2', ..."
    )
    scope = serializers.ChoiceField(choices=TokenScope.values, default=TokenScope.FULL,
                                    help_text="'mcp': look and run only, never approve, deny or administer")  # fmt: skip
    expires_in_days = serializers.IntegerField(min_value=1, max_value=3650, required=False, allow_null=True)
    replace = serializers.CharField(max_length=MAX_NAME_LENGTH, required=False,
                                    help_text="the name of your token to revoke in the same step (a rotation)")  # fmt: skip
