"""Thin views: parse input, call a service, shape the output."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from django.http import HttpRequest, HttpResponse
from django.http.request import HttpHeaders
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.permissions import AllowAny
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from automations.api.serializers import RunAccepted, dispatch_body
from automations.dispatcher import DispatchResult
from automations.selectors import automations_visible_to
from config.api_errors import exception_handler
from config.client_address import client_address
from config.openapi import errors
from workspaces.api import require
from workspaces.models import Permission

from .. import selectors, services, webhooks
from ..models import Trigger
from .serializers import SigningSecretOut, TokenOut, TriggerOut

_NO_STORE = {"Cache-Control": "no-store"}


class AutomationTriggers(generics.ListAPIView):
    serializer_class = TriggerOut

    def get_queryset(self):
        automation = get_object_or_404(automations_visible_to(self.request.user), pk=self.kwargs["pk"])
        return selectors.triggers_of_automation(self.request.user, automation.pk)


class _TriggerAction(APIView):
    # Revoking is an operator's (stop a leaked token now); minting a token or signing secret,
    # which lets its holder start runs, is the workspace admin's, like credentials.
    permission: str = Permission.OPERATE

    def trigger(self, request, pk) -> Trigger:
        trigger = get_object_or_404(selectors.triggers_visible_to(request.user), pk=pk)
        require(request.user, trigger.workspace_id, self.permission)
        return trigger


class TriggerRotateToken(_TriggerAction):
    permission = Permission.ADMINISTER

    @extend_schema(
        request=None, responses={200: TokenOut, **errors(409)}, summary="A new webhook token, shown once"
    )
    def post(self, request, pk):
        token = services.trigger_token_rotate(trigger=self.trigger(request, pk), user=request.user)
        return Response({"trigger_id": str(pk), "token": token}, headers=_NO_STORE)


class TriggerRevokeToken(_TriggerAction):
    @extend_schema(
        request=None, responses={200: TriggerOut, **errors(409)}, summary="Revoke the webhook token"
    )
    def post(self, request, pk):
        trigger = services.trigger_token_revoke(trigger=self.trigger(request, pk), user=request.user)
        return Response(TriggerOut(trigger).data)


class TriggerRotateSigningSecret(_TriggerAction):
    permission = Permission.ADMINISTER

    @extend_schema(
        request=None,
        responses={200: SigningSecretOut, **errors(409)},
        summary="A new signing secret, shown once",
    )
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
    body, status_code = dispatch_body(result)
    return Response(body, status=status_code)


_WEBHOOK_HEADERS = [
    OpenApiParameter(name, str, OpenApiParameter.HEADER, required=False, description=description)
    for name, description in [
        ("Idempotency-Key", "a repeated key answers 200 with the original run_id"),
        ("webhook-id", "Standard Webhooks: required when the trigger has a signing secret"),
        ("webhook-timestamp", "Standard Webhooks: seconds since the epoch"),
        ("webhook-signature", "Standard Webhooks: v1,<base64 HMAC-SHA256>"),
    ]
]


class AutomationFire(APIView):
    """Fire a webhook trigger (SPEC §6.2); the bearer token alone authenticates.

    POST is served by :func:`automation_fire`; this class describes the endpoint in
    the OpenAPI schema and answers every other method (405, OPTIONS).
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]
    parser_classes: list = []  # the raw body is read and checked by the service
    content_negotiation_class = _AlwaysJson

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={202: RunAccepted, 200: RunAccepted, **errors(400, 401, 404, 409, 410, 413, 415, 422, 429)},
        auth=[{"webhookToken": []}],
        parameters=_WEBHOOK_HEADERS,
        summary="Fire the automation's webhook trigger",
    )
    def post(self, request, automation_id: str):
        fire = webhooks.FireRequest(
            automation_id=automation_id, headers=request.headers, content_length=request.META.get("CONTENT_LENGTH"),
            read_body=request._request.read, remote_addr=client_address(request.META),
        )  # fmt: skip
        result = webhooks.webhook_fire(fire)
        return _dispatch_response(result)


_fire_other_methods = AutomationFire.as_view()
_json = JSONRenderer()
_ALLOW = ", ".join(AutomationFire().allowed_methods)


def _rendered(response: Response) -> Response:
    response.accepted_renderer = _json
    response.accepted_media_type = _json.media_type
    response.renderer_context = {}
    return response


class _MetaHeaders(Mapping[str, str]):
    """``request.headers`` for the few headers a fire asks for, each read from ``META`` when asked:
    Django's ``HttpHeaders`` converts every ``META`` key's name on construction."""

    __slots__ = ("_meta",)

    def __init__(self, meta: Mapping[str, str]):
        self._meta = meta

    def __getitem__(self, name: str) -> str:
        key = name.upper().replace("-", "_")
        return self._meta[key if key in HttpHeaders.UNPREFIXED_HEADERS else f"HTTP_{key}"]

    def __iter__(self) -> Iterator[str]:
        return iter(HttpHeaders(self._meta))

    def __len__(self) -> int:
        return len(HttpHeaders(self._meta))


@csrf_exempt
def automation_fire(request: HttpRequest, automation_id: str) -> HttpResponse:
    """``POST /fire`` as a plain Django view: no DRF request wrapper, negotiation or view
    dispatch on the hot path, and the same answers as the APIView byte for byte (DRF's
    JSON renderer, the API's exception handler, DRF's ``Allow`` header)."""
    if request.method != "POST":
        return _fire_other_methods(request, automation_id=automation_id)
    meta = request.META
    fire = webhooks.FireRequest(
        automation_id=automation_id, headers=_MetaHeaders(meta), content_length=meta.get("CONTENT_LENGTH"),
        read_body=request.read, remote_addr=client_address(meta),
    )  # fmt: skip
    try:
        body, status_code = dispatch_body(webhooks.webhook_fire(fire))
        response: HttpResponse = HttpResponse(
            _json.render(body), status=status_code, content_type=_json.media_type
        )
    except Exception as exc:
        handled = exception_handler(exc, {"request": request, "view": None})
        if handled is None:
            raise
        response = _rendered(handled) if isinstance(handled, Response) else handled
    response["Allow"] = _ALLOW
    return response


# drf-spectacular (and tests listing the API's views) read the endpoint from its APIView.
automation_fire.cls = AutomationFire  # type: ignore[attr-defined]
automation_fire.initkwargs = {}  # type: ignore[attr-defined]
