from __future__ import annotations

from rest_framework import serializers

from ..models import Autonomy, Membership, Role, Workspace


class WorkspaceOut(serializers.ModelSerializer):
    class Meta:
        model = Workspace
        fields = ["slug", "name", "four_eyes", "egress_allowlist", "default_autonomy", "policies", "quiet_hours",
                  "created_at"]  # fmt: skip


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
