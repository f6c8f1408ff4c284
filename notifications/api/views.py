"""Thin views: the workspace's notification channels (admins manage them; members see them)."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import InvalidArgument, ServiceError
from config.openapi import errors
from workspaces.api import workspace_for
from workspaces.models import Permission

from .. import services
from ..models import Channel
from .serializers import ChannelCreatedOut, ChannelIn, ChannelOut, ChannelPatch


def _body(request, allowed: set[str]) -> dict:
    if not isinstance(request.data, dict):
        raise ServiceError("INVALID_ARGUMENT", "the body must be a JSON object")
    unknown = sorted(set(request.data) - allowed)
    if unknown:
        raise InvalidArgument(
            [{"path": f"/{unknown[0]}", "code": "unknown_field", "message": "unknown field"}]
        )
    return request.data


class ChannelList(APIView):
    @extend_schema(responses={200: ChannelOut(many=True)}, summary="The workspace's notification channels")
    def get(self, request, slug):
        workspace = workspace_for(request.user, slug, Permission.VIEW)
        channels = Channel.objects.filter(workspace=workspace).order_by("name", "id")
        return Response(ChannelOut(channels, many=True).data)

    @extend_schema(request=ChannelIn, responses={201: ChannelCreatedOut, **errors(403, 409)},
                   summary="Add a channel (admin); a webhook's signing secret is in this answer only")  # fmt: skip
    def post(self, request, slug):
        workspace = workspace_for(request.user, slug, Permission.VIEW)
        data = _body(request, {"kind", "name", "to", "url"})
        channel, secret = services.channel_create(
            workspace=workspace, user=request.user, kind=data.get("kind"), name=data.get("name"),
            to=data.get("to"), url=data.get("url"),
        )  # fmt: skip
        out = dict(ChannelOut(channel).data)
        if secret is not None:
            out["secret"] = secret
        return Response(out, status=201)


class ChannelDetail(APIView):
    def _channel(self, request, slug, pk) -> Channel:
        workspace = workspace_for(request.user, slug, Permission.VIEW)
        return get_object_or_404(Channel.objects.filter(workspace=workspace), pk=pk)

    @extend_schema(responses={200: ChannelOut}, summary="One channel")
    def get(self, request, slug, pk):
        return Response(ChannelOut(self._channel(request, slug, pk)).data)

    @extend_schema(
        request=ChannelPatch,
        responses={200: ChannelOut, **errors(403, 409)},
        summary="Change a channel (admin)",
    )
    def patch(self, request, slug, pk):
        channel = services.channel_update(
            channel=self._channel(request, slug, pk),
            user=request.user,
            changes=_body(request, {"name", "to", "url", "enabled"}),
        )
        return Response(ChannelOut(channel).data)

    @extend_schema(request=None, responses={204: None, **errors(403)}, summary="Remove a channel (admin)")
    def delete(self, request, slug, pk):
        services.channel_delete(channel=self._channel(request, slug, pk), user=request.user)
        return Response(status=204)
