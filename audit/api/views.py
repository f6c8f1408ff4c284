"""The audit API: thin views over selectors and the verify service.

Workspace scoping comes from ``workspaces.access``; this module is the only
part of ``audit`` that knows about workspaces, and nothing in audit imports it.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics
from rest_framework.permissions import AllowAny
from rest_framework.response import Response

from audit import selectors, signing
from audit.verify import verify_all
from audit.writer import chain_for
from config.pagination import AuditPagination
from workspaces.access import workspace_ids_for, workspaces_for
from workspaces.models import Permission

from .serializers import (
    AuditEventSerializer,
    AuditQuerySerializer,
    PublicKeyListSerializer,
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


@extend_schema(tags=["audit"], summary="Verify the chains of your workspaces")
class AuditVerifyView(generics.GenericAPIView):
    serializer_class = VerifyResultSerializer

    def get(self, request, *args, **kwargs):
        workspace_ids = workspaces_for(request.user, Permission.VIEW).values_list("id", flat=True)
        result = verify_all([chain_for(ws_id) for ws_id in workspace_ids])
        return Response(self.get_serializer(result.as_dict()).data)


@extend_schema(tags=["audit"], summary="Public keys that verify checkpoints and approval tokens")
class PublicKeysView(generics.GenericAPIView):
    serializer_class = PublicKeyListSerializer
    authentication_classes: list = []
    permission_classes = [AllowAny]

    def get(self, request, *args, **kwargs):
        return Response(self.get_serializer({"keys": signing.public_keys()}).data)
