"""The audit API: thin views over selectors and the verify service.

Workspace scoping comes from ``workspaces.access``; this module is the only
part of ``audit`` that knows about workspaces, and nothing in audit imports it.
"""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.exceptions import PermissionDenied
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from audit import selectors, signing
from audit.verifications import verification_full, verification_latest
from audit.writer import chain_for
from config.openapi import errors
from config.pagination import AuditPagination
from workspaces.access import workspace_ids_for, workspaces_for
from workspaces.models import Permission

from .serializers import (
    AuditEventSerializer,
    AuditQuerySerializer,
    PublicKeyListSerializer,
    VerifyQuerySerializer,
    VerifyResultSerializer,
)


class _VisibleEventsMixin(generics.GenericAPIView):
    def visible_workspace_ids(self):
        return workspace_ids_for(self.request.user, Permission.VIEW)


@extend_schema(
    tags=["audit"], parameters=[AuditQuerySerializer], summary="Audit events of your workspaces, oldest first"
)
class AuditEventListView(_VisibleEventsMixin, generics.ListAPIView):
    serializer_class = AuditEventSerializer
    pagination_class = AuditPagination

    def get_queryset(self):
        query = AuditQuerySerializer(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return selectors.audit_events(workspace_ids=self.visible_workspace_ids(), **query.validated_data)


@extend_schema(tags=["audit"], summary="One audit event")
class AuditEventDetailView(_VisibleEventsMixin, generics.RetrieveAPIView):
    serializer_class = AuditEventSerializer

    def get_queryset(self):
        return selectors.audit_events(workspace_ids=self.visible_workspace_ids())


@extend_schema(
    tags=["audit"], parameters=[VerifyQuerySerializer], responses={200: VerifyResultSerializer, **errors(403, 429)},
    summary="The last verification of your workspaces' chains (a full walk now with ?full=true, admins)",
)  # fmt: skip
class AuditVerifyView(generics.GenericAPIView):
    serializer_class = VerifyResultSerializer

    def get(self, request, *args, **kwargs):
        query = VerifyQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        workspace_ids = workspaces_for(request.user, Permission.VIEW).values_list("id", flat=True)
        chains = [chain_for(ws_id) for ws_id in workspace_ids]
        if query.validated_data["full"]:
            administered = set(workspace_ids_for(request.user, Permission.ADMINISTER))
            if not chains or not administered.issuperset(workspace_ids):
                raise PermissionDenied("a full verification is for admins of every workspace it covers")
            body = {**verification_full(chains).as_dict(), "verified_at": timezone.now(), "full": True}
        else:
            result, verified_at, full = verification_latest(chains)
            body = {**result.as_dict(), "verified_at": verified_at, "full": full}
        return Response(self.get_serializer(body).data)


@extend_schema(tags=["audit"], summary="Public keys that verify checkpoints and approval tokens")
class PublicKeysView(generics.GenericAPIView):
    serializer_class = PublicKeyListSerializer
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def get(self, request, *args, **kwargs):
        return Response(self.get_serializer({"keys": signing.public_keys()}).data)
