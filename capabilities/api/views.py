from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import InvalidArgument
from config.openapi import errors
from workspaces.access import workspaces_for
from workspaces.api import require, workspace_for_write
from workspaces.models import Permission

from .. import credentials, mcp, registry
from ..base import Capability
from ..models import Credential, McpServer, McpTool
from .serializers import (
    ActionPage,
    CapabilityPage,
    CredentialIn,
    CredentialOut,
    CredentialSecretIn,
    HarvestOut,
    McpServerIn,
    McpServerOut,
    McpServerPatch,
    McpToolOut,
    McpToolPatch,
    McpToolQuery,
)


def capability_out(capability: Capability, workspace: str | None = None) -> dict:
    return {
        "id": capability.id,
        "description": capability.description,
        "input_schema": capability.input_schema,
        "output_schema": capability.output_schema,
        "side_effects": sorted(capability.side_effects),
        "risk": capability.risk.label,
        "idempotent": capability.idempotent,
        "expected_duration_seconds": capability.expected_duration_seconds,
        "workspace": workspace,
    }


class ActionList(APIView):
    @extend_schema(responses=ActionPage, summary="The actions a step can name")
    def get(self, request):
        actions = [
            {"name": a.name, "description": a.description, "config_schema": a.config_schema}
            for a in registry.all_actions()
        ]
        return Response({"count": len(actions), "next": None, "previous": None, "results": actions})


class CapabilityList(APIView):
    @extend_schema(responses=CapabilityPage, summary="The capabilities of your workspaces")
    def get(self, request):
        seen: dict[str, dict] = {}
        for workspace in workspaces_for(request.user, Permission.VIEW):
            for capability in registry.list_capabilities(workspace.id):
                native = registry.get_native_capability(capability.id) is not None
                key = capability.id if native else f"{workspace.slug}/{capability.id}"
                seen.setdefault(key, capability_out(capability, None if native else workspace.slug))
        results = sorted(seen.values(), key=lambda c: (c["workspace"] or "", c["id"]))
        return Response({"count": len(results), "next": None, "previous": None, "results": results})


# --- credentials and MCP --------------------------------------------------------------


def _visible(queryset, user, field: str = "workspace"):
    return queryset.filter(**{f"{field}__in": workspaces_for(user, Permission.VIEW)})


def _filter_workspace(queryset, request, field: str = "workspace"):
    slug = request.query_params.get("workspace")
    return queryset.filter(**{f"{field}__slug": slug}) if slug else queryset


class _CredentialShapes(generics.GenericAPIView):
    """Operators and admins see metadata and grants; viewers and approvers names and kinds only."""

    def get_serializer_context(self):
        operated = set(workspaces_for(self.request.user, Permission.OPERATE).values_list("pk", flat=True))
        return {**super().get_serializer_context(), "operated_workspaces": operated}


class CredentialList(_CredentialShapes, generics.ListAPIView):
    serializer_class = CredentialOut

    def get_queryset(self):
        queryset = _visible(Credential.objects.select_related("workspace"), self.request.user)
        return _filter_workspace(queryset, self.request).order_by("workspace__slug", "name")

    @extend_schema(request=CredentialIn, responses={201: CredentialOut, **errors(404, 409)})
    def post(self, request):
        data = CredentialIn(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = workspace_for_write(request, data.validated_data.get("workspace"), Permission.ADMINISTER)
        credential = credentials.credential_create(
            workspace=workspace, name=data.validated_data["name"], kind=data.validated_data["kind"],
            secret=data.validated_data["secret"], metadata=data.validated_data.get("metadata"), user=request.user,
            allowed_destinations=data.validated_data["allowed_destinations"],
            allow_code_steps=data.validated_data["allow_code_steps"],
            allowed_automations=data.validated_data["allowed_automations"],
            approval_always=data.validated_data["approval_always"],
        )  # fmt: skip
        return Response(CredentialOut(credential).data, status=status.HTTP_201_CREATED)


class CredentialDetail(_CredentialShapes, generics.RetrieveAPIView):
    serializer_class = CredentialOut

    def get_queryset(self):
        return _visible(Credential.objects.select_related("workspace"), self.request.user)

    @extend_schema(responses={204: None, **errors(409)})
    def delete(self, request, pk):
        credential = self.get_object()
        require(request.user, credential.workspace_id, Permission.ADMINISTER)
        credentials.credential_delete(credential=credential, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class CredentialSecret(generics.GenericAPIView):
    """Replace a credential's secret and/or metadata. The response never contains the secret."""

    serializer_class = CredentialSecretIn

    def get_queryset(self):
        return _visible(Credential.objects.select_related("workspace"), self.request.user)

    @extend_schema(request=CredentialSecretIn, responses={200: CredentialOut, **errors(409)})
    def post(self, request, pk):
        credential = self.get_object()
        require(request.user, credential.workspace_id, Permission.ADMINISTER)
        data = CredentialSecretIn(data=request.data)
        data.is_valid(raise_exception=True)
        credential = credentials.credential_update_secret(
            credential=credential, secret=data.validated_data.get("secret"),
            metadata=data.validated_data.get("metadata"), user=request.user,
            grant={k: v for k, v in data.validated_data.items() if k in credentials.GRANT_FIELDS},
        )  # fmt: skip
        return Response(CredentialOut(credential).data)


def _credential_by_name(workspace_id: int, name: str | None) -> Credential | None:
    if name is None:
        return None
    credential = Credential.objects.filter(workspace_id=workspace_id, name=name).first()
    if credential is None:
        raise InvalidArgument([{"path": "/credential", "code": "unknown_credential",
                                 "message": f"no credential named '{name}' in this workspace"}])  # fmt: skip
    return credential


class _McpServerShapes(generics.GenericAPIView):
    """Admins see env values and whole URLs; viewers the keys and masked URLs (McpServerOut)."""

    def get_serializer_context(self):
        administered = set(
            workspaces_for(self.request.user, Permission.ADMINISTER).values_list("pk", flat=True)
        )
        return {**super().get_serializer_context(), "administered_workspaces": administered}


class McpServerList(_McpServerShapes, generics.ListAPIView):
    serializer_class = McpServerOut

    def get_queryset(self):
        queryset = _visible(McpServer.objects.select_related("workspace", "credential"), self.request.user)
        return _filter_workspace(queryset, self.request).order_by("workspace__slug", "slug")

    @extend_schema(request=McpServerIn, responses={201: McpServerOut, **errors(404, 409)})
    def post(self, request):
        data = McpServerIn(data=request.data)
        data.is_valid(raise_exception=True)
        values = dict(data.validated_data)
        workspace = workspace_for_write(request, values.pop("workspace", None), Permission.ADMINISTER)
        credential = _credential_by_name(workspace.id, values.pop("credential", None))
        server = mcp.mcp_server_create(
            workspace=workspace, credential=credential, user=request.user, **values
        )
        return Response(self.get_serializer(server).data, status=status.HTTP_201_CREATED)


class McpServerDetail(_McpServerShapes, generics.RetrieveAPIView):
    serializer_class = McpServerOut

    def get_queryset(self):
        return _visible(McpServer.objects.select_related("workspace", "credential"), self.request.user)

    @extend_schema(request=McpServerPatch, responses={200: McpServerOut, **errors(409)})
    def patch(self, request, pk):
        server = self.get_object()
        require(request.user, server.workspace_id, Permission.ADMINISTER)
        data = McpServerPatch(data=request.data)
        data.is_valid(raise_exception=True)
        changes = dict(data.validated_data)
        if "credential" in changes:
            changes["credential"] = _credential_by_name(server.workspace_id, changes["credential"])
        server = mcp.mcp_server_update(server=server, user=request.user, **changes)
        return Response(self.get_serializer(server).data)


# APIView, not GenericAPIView: these POSTs take no body, and OPTIONS on a generic view
# without a serializer is a 500.
class McpServerHarvest(APIView):
    @extend_schema(request=None, responses={200: HarvestOut, **errors(502)})
    def post(self, request, pk):
        server = generics.get_object_or_404(_visible(McpServer.objects.all(), request.user), pk=pk)
        require(request.user, server.workspace_id, Permission.ADMINISTER)
        result = mcp.mcp_harvest(server, user=request.user)
        return Response(result.counts())


@extend_schema(parameters=[McpToolQuery])
class McpServerTools(generics.ListAPIView):
    serializer_class = McpToolOut

    def get_queryset(self):
        server = generics.get_object_or_404(
            _visible(McpServer.objects.all(), self.request.user), pk=self.kwargs["pk"]
        )
        queryset = McpTool.objects.select_related("server").filter(server=server)
        query = McpToolQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        if status_filter := query.validated_data.get("status"):
            queryset = queryset.filter(status=status_filter)
        return queryset.order_by("name")


def _tools_visible(user):
    return _visible(McpTool.objects.select_related("server"), user, field="server__workspace")


class McpToolDetail(generics.RetrieveAPIView):
    serializer_class = McpToolOut

    def get_queryset(self):
        return _tools_visible(self.request.user)

    @extend_schema(request=McpToolPatch, responses={200: McpToolOut, **errors(409)})
    def patch(self, request, pk):
        tool = self.get_object()
        require(request.user, tool.server.workspace_id, Permission.ADMINISTER)
        data = McpToolPatch(data=request.data)
        data.is_valid(raise_exception=True)
        tool = mcp.mcp_tool_set_risk(tool=tool, risk=data.validated_data["risk_override"], user=request.user)
        return Response(McpToolOut(tool).data)


class McpToolApprove(APIView):
    @extend_schema(request=None, responses={200: McpToolOut, **errors(409)})
    def post(self, request, pk):
        tool = generics.get_object_or_404(_tools_visible(request.user), pk=pk)
        require(request.user, tool.server.workspace_id, Permission.ADMINISTER)
        tool = mcp.mcp_tool_approve(tool=tool, user=request.user)
        return Response(McpToolOut(tool).data)
