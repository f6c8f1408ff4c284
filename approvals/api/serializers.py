"""Shapes of the approvals API. Serializers describe data; services do the writing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rest_framework import serializers

from ..models import Approval, StandingApproval
from ..services import standing_approval_state

if TYPE_CHECKING:
    from django.contrib.auth.models import User

    from workspaces.models import Workspace


class ApprovalOut(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    approvals_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Approval
        fields = ["id", "workspace", "run_id", "automation_id", "automation_name", "step_id", "action",
                  "capability_id", "status", "risk", "reasons", "what", "why", "message", "plan_hash",
                  "requested_by", "approvals_required", "approvals_count", "expires_at", "created_at",
                  "decided_at", "answer", "edited_by"]  # fmt: skip


class ApprovalQuery(serializers.Serializer):
    status = serializers.ChoiceField(
        choices=["pending", "approved", "denied", "expired", "consumed", "invalidated"],
        required=False,
        allow_blank=True,
    )


class DecisionIn(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class DecideIn(serializers.Serializer):
    decision = serializers.ChoiceField(choices=["approve", "deny", "answer"])
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")
    value = serializers.JSONField(required=False, help_text="answer: one of the question's option values")
    freetext = serializers.JSONField(
        required=False, help_text="answer: free text, when the question allows it"
    )
    edited_config = serializers.JSONField(
        required=False,
        help_text="approve: a whole config of the same action to run instead of the rendered one "
        "(edit-then-approve; validated, risk and gate applied again)",
    )


class LinkOut(serializers.Serializer):
    url = serializers.CharField()


class StandingApprovalOut(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    created_by: serializers.SlugRelatedField[User] = serializers.SlugRelatedField(
        slug_field="username", read_only=True
    )
    state = serializers.SerializerMethodField(
        help_text="active | revoked | expired | used up | void since version N | void: signed by a retired key | "
        "void: its signature does not match its bounds | void: not bound to a version"
    )
    void_since_version = serializers.SerializerMethodField(
        help_text="the automation was edited after the grant: no run of this version or later is covered"
    )

    class Meta:
        model = StandingApproval
        fields = ["id", "workspace", "automation_id", "automation_version", "capability_id", "max_uses", "uses",
                  "expires_at", "arg_constraint", "reason", "created_by", "revoked", "revoked_at", "key_id",
                  "state", "void_since_version", "created_at"]  # fmt: skip
        extra_kwargs = {
            "automation_version": {"help_text": "the automation version it was granted for (signed)"}
        }

    def _state(self, standing: StandingApproval) -> dict:
        cache = self.context.setdefault("standing_states", {}) if isinstance(self.context, dict) else {}
        if standing.pk not in cache:
            cache[standing.pk] = standing_approval_state(standing)
        return cache[standing.pk]

    def get_state(self, standing: StandingApproval) -> str:
        return self._state(standing)["state"]

    def get_void_since_version(self, standing: StandingApproval) -> int | None:
        return self._state(standing)["void_since_version"]


class StandingApprovalIn(serializers.Serializer):
    workspace = serializers.SlugField(
        required=False, help_text="Needed when you approve in several workspaces."
    )
    automation_id = serializers.UUIDField()
    capability_id = serializers.CharField(max_length=200)
    max_uses = serializers.IntegerField(min_value=1, max_value=10_000)
    expires_at = serializers.DateTimeField(required=False)
    expires_in_seconds = serializers.IntegerField(required=False, min_value=60, max_value=365 * 86400)
    arg_constraint = serializers.JSONField(required=False, allow_null=True, default=None)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")

    def validate(self, attrs):
        if ("expires_at" in attrs) == ("expires_in_seconds" in attrs):
            raise serializers.ValidationError("give exactly one of expires_at and expires_in_seconds")
        return attrs
