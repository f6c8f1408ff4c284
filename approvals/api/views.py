"""Thin views: parse input, call a service, shape the output."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.exceptions import NotFound
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import ServiceError
from config.openapi import errors
from workspaces.access import default_workspace_for, has_permission, workspaces_for
from workspaces.models import Permission

from .. import selectors, services
from ..models import Approval, Decision
from .serializers import (
    ApprovalOut,
    ApprovalQuery,
    DecideIn,
    DecisionIn,
    LinkOut,
    StandingApprovalIn,
    StandingApprovalOut,
)


def _approval_response(approval_id) -> Response:
    approval = selectors.with_counts(Approval.objects.filter(pk=approval_id)).get()
    return Response(ApprovalOut(approval).data)


@extend_schema(parameters=[ApprovalQuery], summary="Approvals in your workspaces (newest first)")
class ApprovalList(generics.ListAPIView):
    serializer_class = ApprovalOut

    def get_queryset(self):
        query = ApprovalQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return selectors.approvals_visible_to(self.request.user, query.validated_data.get("status"))


@extend_schema(summary="One approval")
class ApprovalDetail(generics.RetrieveAPIView):
    serializer_class = ApprovalOut

    def get_queryset(self):
        return selectors.approvals_visible_to(self.request.user)


class _Decide(APIView):
    decision = Decision.APPROVE

    @extend_schema(request=DecisionIn, responses={200: ApprovalOut, **errors(409)})
    def post(self, request, pk):
        approval = get_object_or_404(selectors.approvals_visible_to(request.user), pk=pk)
        body = DecisionIn(data=request.data if isinstance(request.data, dict) else {})
        body.is_valid(raise_exception=True)
        services.approval_decide(approval_id=approval.pk, user=request.user, decision=self.decision,
                                 reason=body.validated_data["reason"], via="api")  # fmt: skip
        return _approval_response(approval.pk)


class ApprovalApprove(_Decide):
    decision = Decision.APPROVE


class ApprovalDeny(_Decide):
    decision = Decision.DENY


class ApprovalDecide(APIView):
    @extend_schema(request=DecideIn, responses={200: ApprovalOut, **errors(409)},
                   summary="Decide: approve, deny (with a reason) or answer an ask_human question")  # fmt: skip
    def post(self, request, pk):
        approval = get_object_or_404(selectors.approvals_visible_to(request.user), pk=pk)
        data = request.data if isinstance(request.data, dict) else None
        if data is None:
            raise ServiceError("INVALID_ARGUMENT", "the body must be a JSON object")
        unknown = sorted(set(data) - {"decision", "reason", "value", "freetext", "edited_config"})
        if unknown:
            raise ServiceError("INVALID_ARGUMENT", f"unknown field {unknown[0]!r}")
        edited = data.get("edited_config")
        if "edited_config" in data and (data.get("decision") != "approve" or not isinstance(edited, dict)):
            raise ServiceError(
                "INVALID_ARGUMENT", "edited_config is a whole config object, with approve only"
            )
        body = DecideIn(data=data)
        body.is_valid(raise_exception=True)
        values = body.validated_data
        if values["decision"] == "answer":
            # The raw values: a number is not free text, and "1" is not the option 1.
            services.approval_answer(approval_id=approval.pk, user=request.user, value=data.get("value"),
                                     freetext=data.get("freetext", ""), via="api")  # fmt: skip
        else:
            services.approval_decide(approval_id=approval.pk, user=request.user, decision=values["decision"],
                                     reason=values["reason"], via="api", edited_config=edited)  # fmt: skip
        return _approval_response(approval.pk)


class ApprovalLink(APIView):
    @extend_schema(
        request=None,
        responses={201: LinkOut, **errors(409)},
        summary="A one-click approve link for the caller",
    )
    def post(self, request, pk):
        approval = get_object_or_404(selectors.approvals_visible_to(request.user), pk=pk)
        path = services.approval_link_create(approval=approval, user=request.user)
        # The token is in the URL's fragment, never its path or query (see approvals/views.py).
        return Response({"url": settings.AUTOPLANE_PUBLIC_URL.rstrip("/") + path}, status=201)


class StandingApprovalList(generics.ListAPIView):
    serializer_class = StandingApprovalOut

    def get_queryset(self):
        return selectors.standing_approvals_visible_to(self.request.user)

    @extend_schema(request=StandingApprovalIn, responses={201: StandingApprovalOut, **errors(404, 409)})
    def post(self, request):
        body = StandingApprovalIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        if data.get("workspace"):
            workspace = workspaces_for(request.user, Permission.VIEW).filter(slug=data["workspace"]).first()
            if workspace is None:
                raise NotFound("workspace not found")
        else:
            workspace = default_workspace_for(request.user, Permission.APPROVE)
            if workspace is None:
                raise ServiceError(
                    "INVALID_ARGUMENT", "name the workspace: you approve in none or in several"
                )
        expires_at = data.get("expires_at") or timezone.now() + timedelta(seconds=data["expires_in_seconds"])
        standing = services.standing_approval_create(
            workspace=workspace, automation_id=data["automation_id"], capability_id=data["capability_id"],
            max_uses=data["max_uses"], expires_at=expires_at, user=request.user,
            arg_constraint=data.get("arg_constraint"), reason=data.get("reason", ""),
        )  # fmt: skip
        return Response(StandingApprovalOut(standing).data, status=201)


class StandingApprovalRevoke(APIView):
    @extend_schema(request=None, responses={200: StandingApprovalOut, **errors(409)})
    def post(self, request, pk):
        standing = get_object_or_404(selectors.standing_approvals_visible_to(request.user), pk=pk)
        if not has_permission(request.user, standing.workspace_id, Permission.APPROVE):
            raise ServiceError(
                "PERMISSION_DENIED", "your role in this workspace does not allow approving", 403
            )
        standing = services.standing_approval_revoke(standing_id=standing.pk, user=request.user)
        return Response(StandingApprovalOut(standing).data)
