"""Shapes of the audit API; no behaviour."""

from __future__ import annotations

from rest_framework import serializers

from audit.models import AuditEvent


class AuditQuerySerializer(serializers.Serializer):
    trace_id = serializers.CharField(
        required=False, allow_blank=True, max_length=64, help_text="events of one trace, in order"
    )
    type = serializers.CharField(
        required=False, allow_blank=True, max_length=64, help_text="e.g. run.created"
    )
    run = serializers.CharField(
        required=False, allow_blank=True, max_length=64, help_text="events whose refs.run is this run id"
    )


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id", "timestamp", "trace_id", "stage", "type", "summary", "outcome", "refs", "actor",
            "payload", "hash", "prev_hash", "seq", "chain", "workspace_id",
        ]  # fmt: skip
        read_only_fields = fields


class BrokenLinkSerializer(serializers.Serializer):
    chain = serializers.CharField()
    reason = serializers.CharField()
    event_id = serializers.IntegerField(allow_null=True)
    seq = serializers.IntegerField(allow_null=True)
    checkpoint_id = serializers.IntegerField(allow_null=True)


class VerifyResultSerializer(serializers.Serializer):
    ok = serializers.BooleanField()
    chains = serializers.IntegerField(help_text="number of chains verified")
    events = serializers.IntegerField(help_text="events verified")
    checkpoints = serializers.IntegerField(help_text="signed checkpoints verified")
    broken = BrokenLinkSerializer(allow_null=True, help_text="the first broken link, or null")
    verified_at = serializers.DateTimeField(
        allow_null=True, help_text="when these chains were last verified (the oldest of their times)"
    )
    full = serializers.BooleanField(
        help_text="whether that was a full walk (every row, every signature) rather than one from the newest checkpoint"
    )


class VerifyQuerySerializer(serializers.Serializer):
    full = serializers.BooleanField(
        required=False, default=False,
        help_text="walk every row and signature now: admins only, once per chain per "
        "AUTOPLANE_AUDIT_FULL_VERIFY_INTERVAL_SECONDS (else 429 with Retry-After)",
    )  # fmt: skip

    def to_internal_value(self, data):
        # DRF reads an empty ?full= as absent; it is not a boolean, so it is refused like ?full=maybe.
        if "full" in data and data.get("full") == "":
            raise serializers.ValidationError({"full": ["a boolean: true or false"]})
        return super().to_internal_value(data)


class PublicKeySerializer(serializers.Serializer):
    key_id = serializers.CharField(help_text="first 16 hex digits of sha256(raw public key)")
    algorithm = serializers.CharField()
    public_key = serializers.CharField(help_text="raw 32-byte public key, base64url without padding")
    pem = serializers.CharField(help_text="SubjectPublicKeyInfo PEM")
    current = serializers.BooleanField(help_text="false for retired keys kept to verify old signatures")


class PublicKeyListSerializer(serializers.Serializer):
    keys = PublicKeySerializer(many=True)
