"""Workspaces and members over the API (SPEC §11): the workspace's admins only; writes are the
audited services the admin uses too."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models import F
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from audit import writer
from config.errors import ServiceError
from config.openapi import errors

from .. import api_tokens, services
from ..access import scope_allows, workspaces_for
from ..models import ApiToken, Membership, Permission, TokenScope, Workspace
from . import require
from .serializers import (
    ApiTokenCreated,
    ApiTokenIn,
    ApiTokenOut,
    MemberIn,
    MemberOut,
    MemberRemove,
    WorkspaceCreate,
    WorkspaceListOut,
    WorkspaceOut,
    WorkspacePatch,
)


def _administered(request, slug: str) -> Workspace:
    """Non-members get 404 (they never see it), members without the admin role 403."""
    workspace = workspaces_for(request.user, Permission.VIEW).filter(slug=slug).first()
    if workspace is None:
        raise ServiceError("NOT_FOUND", "workspace not found", 404)
    require(request.user, workspace.id, Permission.ADMINISTER)
    return workspace


class WorkspaceList(generics.ListAPIView):
    serializer_class = WorkspaceListOut

    def get_queryset(self):
        user = self.request.user
        if not user.is_authenticated:  # refused before this by IsAuthenticated
            return Workspace.objects.none()
        return (
            Workspace.objects.filter(memberships__user=user)
            .annotate(role=F("memberships__role"))
            .order_by("slug")
        )

    @extend_schema(request=WorkspaceCreate, responses={201: WorkspaceOut, **errors(409)})
    def post(self, request):
        if not request.user.is_superuser or not scope_allows(request.user, Permission.ADMINISTER):
            raise ServiceError("PERMISSION_DENIED", "only a superuser creates workspaces", 403)
        data = WorkspaceCreate(data=request.data)
        data.is_valid(raise_exception=True)
        if Workspace.objects.filter(slug=data.validated_data["slug"]).exists():
            raise ServiceError("CONFLICT", "a workspace with this slug exists", 409)
        workspace = services.workspace_get_or_create(slug=data.validated_data["slug"], name=data.validated_data["name"],
                                                     actor=writer.actor_for(request.user))  # fmt: skip
        services.membership_set_role(workspace=workspace, user=request.user, role="admin",
                                     actor=writer.actor_for(request.user))  # fmt: skip
        return Response(WorkspaceOut(workspace).data, status=status.HTTP_201_CREATED)


class WorkspaceDetail(APIView):
    @extend_schema(responses=WorkspaceOut)
    def get(self, request, slug):
        return Response(WorkspaceOut(_administered(request, slug)).data)

    @extend_schema(request=WorkspacePatch, responses=WorkspaceOut)
    def patch(self, request, slug):
        workspace = _administered(request, slug)
        data = WorkspacePatch(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = services.workspace_update(workspace=workspace, user=request.user, **data.validated_data)
        return Response(WorkspaceOut(workspace).data)


class WorkspaceMembers(generics.ListAPIView):
    serializer_class = MemberOut

    def get_queryset(self):
        workspace = _administered(self.request, self.kwargs["slug"])
        return (
            Membership.objects.filter(workspace=workspace).select_related("user").order_by("user__username")
        )

    @extend_schema(request=MemberIn, responses={200: MemberOut, **errors(409)})
    def post(self, request, slug):
        workspace = _administered(request, slug)
        data = MemberIn(data=request.data)
        data.is_valid(raise_exception=True)
        user = get_user_model().objects.filter(username=data.validated_data["username"]).first()
        if user is None:
            raise ServiceError("NOT_FOUND", "no user with this username", 404)
        membership = services.membership_set_role(workspace=workspace, user=user, role=data.validated_data["role"],
                                                  actor=writer.actor_for(request.user))  # fmt: skip
        return Response(MemberOut(membership).data)

    @extend_schema(request=MemberRemove, responses={204: None, **errors(409)})
    def delete(self, request, slug):
        workspace = _administered(request, slug)
        data = MemberRemove(data=request.data)
        data.is_valid(raise_exception=True)
        membership = Membership.objects.filter(
            workspace=workspace, user__username=data.validated_data["username"]
        ).first()
        if membership is None:
            raise ServiceError("NOT_FOUND", "no member with this username", 404)
        services.membership_remove(membership=membership, actor=writer.actor_for(request.user))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- your API tokens --------------------------------------------------------------------------


def _manages_tokens(request) -> None:
    """Tokens are made and revoked with a full-scope token or a session: an ``mcp`` token can
    neither mint itself a full one nor revoke its user's others."""
    if getattr(request.user, "api_token_scope", TokenScope.FULL) != TokenScope.FULL:
        raise ServiceError("PERMISSION_DENIED", "an 'mcp'-scoped token cannot create or revoke tokens", 403)


class ApiTokenList(generics.ListAPIView):
    serializer_class = ApiTokenOut

    @extend_schema(summary="Your API tokens (never the tokens themselves)")
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        return api_tokens.tokens_of(self.request.user)

    @extend_schema(request=ApiTokenIn, responses={201: ApiTokenCreated, **errors(404, 409)},
                   summary="A new API token for you: the token is in this answer only")  # fmt: skip
    def post(self, request):
        _manages_tokens(request)
        data = ApiTokenIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        token, key = api_tokens.token_create(
            user=request.user, name=values.get("name"), scope=values["scope"], replace=values.get("replace"),
            expires_at=api_tokens.expires_in_days(values.get("expires_in_days")),
            actor=writer.actor_for(request.user),
        )  # fmt: skip
        return Response({**ApiTokenOut(token).data, "token": key}, status=status.HTTP_201_CREATED)


def _own_token(request, pk: int) -> ApiToken:
    token = api_tokens.tokens_of(request.user).filter(pk=pk).select_related("user").first()
    if token is None:
        raise ServiceError("NOT_FOUND", "not found", 404)
    return token


class ApiTokenDetail(APIView):
    @extend_schema(responses=ApiTokenOut, summary="One of your API tokens")
    def get(self, request, pk):
        return Response(ApiTokenOut(_own_token(request, pk)).data)

    @extend_schema(request=None, responses={204: None}, summary="Revoke one of your API tokens")
    def delete(self, request, pk):
        return _revoke(request, pk)


class ApiTokenRevoke(APIView):
    @extend_schema(request=None, responses={204: None}, summary="Revoke one of your API tokens")
    def post(self, request, pk):
        return _revoke(request, pk)


def _revoke(request, pk: int) -> Response:
    _manages_tokens(request)
    api_tokens.token_revoke(token=_own_token(request, pk), actor=writer.actor_for(request.user))
    return Response(status=status.HTTP_204_NO_CONTENT)
