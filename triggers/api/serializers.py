from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ..models import Trigger
from ..schedules import next_fire_at


class TriggerOut(serializers.ModelSerializer):
    automation = serializers.UUIDField(source="automation_id", read_only=True)
    next_fire_at = serializers.SerializerMethodField()
    has_token = serializers.BooleanField(read_only=True)
    has_signing_secret = serializers.BooleanField(read_only=True)

    class Meta:
        model = Trigger
        fields = ["id", "automation", "key", "type", "config", "enabled", "last_fired_at", "next_fire_at",
                  "has_token", "token_created_at", "token_revoked_at", "has_signing_secret", "created_at"]  # fmt: skip

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_next_fire_at(self, trigger: Trigger) -> str | None:
        moment = next_fire_at(trigger)
        return serializers.DateTimeField().to_representation(moment) if moment else None


class TokenOut(serializers.Serializer):
    trigger_id = serializers.UUIDField()
    token = serializers.CharField(help_text="Shown once; only its hash is stored.")


class SigningSecretOut(serializers.Serializer):
    trigger_id = serializers.UUIDField()
    signing_secret = serializers.CharField(help_text="Standard Webhooks secret (whsec_...), shown once.")
