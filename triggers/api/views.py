"""Thin views: parse input, call a service, shape the output."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from automations.dispatcher import DispatchResult
from automations.selectors import automations_visible_to
from workspaces.api import require
from workspaces.models import Permission

from .. import selectors, services, webhooks
from ..models import Trigger
from .serializers import FireOut, SigningSecretOut, TokenOut, TriggerOut

_NO_STORE = {"Cache-Control": "no-store"}


class AutomationTriggers(generics.ListAPIView):
    serializer_class = TriggerOut

    def get_queryset(self):
        automation = get_object_or_404(automations_visible_to(self.request.user), pk=self.kwargs["pk"])
        return selectors.triggers_of_automation(self.request.user, automation.pk)


class _TriggerAction(APIView):
    def trigger(self, request, pk) -> Trigger:
        trigger = get_object_or_404(selectors.triggers_visible_to(request.user), pk=pk)
        require(request.user, trigger.workspace_id, Permission.OPERATE)
        return trigger


class TriggerRotateToken(_TriggerAction):
    @extend_schema(request=None, responses=TokenOut, summary="A new webhook token, shown once")
    def post(self, request, pk):
        token = services.trigger_token_rotate(trigger=self.trigger(request, pk), user=request.user)
        return Response({"trigger_id": str(pk), "token": token}, headers=_NO_STORE)


class TriggerRevokeToken(_TriggerAction):
    @extend_schema(request=None, responses=TriggerOut, summary="Revoke the webhook token")
    def post(self, request, pk):
        trigger = services.trigger_token_revoke(trigger=self.trigger(request, pk), user=request.user)
        return Response(TriggerOut(trigger).data)


class TriggerRotateSigningSecret(_TriggerAction):
    @extend_schema(request=None, responses=SigningSecretOut, summary="A new signing secret, shown once")
    def post(self, request, pk):
        secret = services.trigger_signing_secret_rotate(trigger=self.trigger(request, pk), user=request.user)
        return Response({"trigger_id": str(pk), "signing_secret": secret}, headers=_NO_STORE)


class _AlwaysJson(BaseContentNegotiation):
    """Webhook senders send whatever Accept they like; the answer is JSON regardless."""

    def select_parser(self, request, parsers):
        return None

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


def _dispatch_response(result: DispatchResult) -> Response:
    if result.suppressed:
        return Response({"run_id": None, "suppressed": True, "reason": "drop_if_running"}, status=200)
    run = result.run
    body = {"run_id": str(run.pk), "status_url": f"/api/v1/runs/{run.pk}", "status": run.status}
    return Response(body, status=200 if result.deduplicated else 202)


class AutomationFire(APIView):
    """Fire a webhook trigger (SPEC §6.2); the bearer token alone authenticates."""

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes: list = []  # the raw body is read and checked by the service
    content_negotiation_class = _AlwaysJson

    @extend_schema(
        request={"application/json": dict},
        responses={
            202: FireOut,
            200: FireOut,
            400: OpenApiResponse(description="invalid body"),
            401: OpenApiResponse(description="invalid or missing token"),
            409: None,
            413: None,
            415: None,
            422: None,
            429: None,
        },  # fmt: skip
        summary="Fire the automation's webhook trigger",
    )
    def post(self, request, automation_id: str):
        fire = webhooks.FireRequest(
            automation_id=automation_id, headers=request.headers, content_length=request.META.get("CONTENT_LENGTH"),
            read_body=request._request.read, remote_addr=request.META.get("REMOTE_ADDR", ""),
        )  # fmt: skip
        result = webhooks.webhook_fire(fire)
        return _dispatch_response(result)
