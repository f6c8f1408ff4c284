from __future__ import annotations

from rest_framework import serializers

from ..models import Autonomy, Membership, Role, Workspace


class WorkspaceOut(serializers.ModelSerializer):
    class Meta:
        model = Workspace
        fields = ["slug", "name", "four_eyes", "egress_allowlist", "default_autonomy", "created_at"]


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
