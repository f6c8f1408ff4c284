"""Shapes of the channels API. Serializers describe data; services do the writing."""

from __future__ import annotations

from rest_framework import serializers

from .. import services
from ..models import Channel, ChannelKind


class ChannelOut(serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="slug", read_only=True)  # type: ignore[var-annotated]
    url = serializers.SerializerMethodField()
    failing = serializers.BooleanField(read_only=True)

    class Meta:
        model = Channel
        fields = ["id", "workspace", "kind", "name", "to", "url", "enabled", "failing", "consecutive_failures",
                  "last_error", "last_failure_at", "last_success_at", "created_at"]  # fmt: skip

    def get_url(self, channel: Channel) -> str:
        """A webhook's URL; of a Slack channel only the host (its URL is a secret)."""
        return services.channel_url_hint(channel)


class ChannelCreatedOut(ChannelOut):
    secret = serializers.CharField(
        required=False, help_text="webhook only: the whsec_ signing secret, shown this once"
    )

    class Meta(ChannelOut.Meta):
        fields = [*ChannelOut.Meta.fields, "secret"]


class ChannelIn(serializers.Serializer):
    kind = serializers.ChoiceField(choices=ChannelKind.choices)
    name = serializers.CharField(max_length=100)
    to = serializers.ListField(child=serializers.CharField(), required=False, help_text="email only")
    url = serializers.CharField(required=False, help_text="slack and webhook only")


class ChannelPatch(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    to = serializers.ListField(child=serializers.CharField(), required=False)
    url = serializers.CharField(required=False)
    enabled = serializers.BooleanField(required=False)
