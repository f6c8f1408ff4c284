from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from workspaces.access import workspaces_for
from workspaces.models import Permission

from .. import registry
from ..base import Capability


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
    @extend_schema(responses=dict)
    def get(self, request):
        actions = [
            {"name": a.name, "description": a.description, "config_schema": a.config_schema}
            for a in registry.all_actions()
        ]
        return Response({"count": len(actions), "next": None, "previous": None, "results": actions})


class CapabilityList(APIView):
    @extend_schema(responses=dict)
    def get(self, request):
        seen: dict[str, dict] = {}
        for workspace in workspaces_for(request.user, Permission.VIEW):
            for capability in registry.list_capabilities(workspace.id):
                native = registry.get_native_capability(capability.id) is not None
                key = capability.id if native else f"{workspace.slug}/{capability.id}"
                seen.setdefault(key, capability_out(capability, None if native else workspace.slug))
        results = sorted(seen.values(), key=lambda c: (c["workspace"] or "", c["id"]))
        return Response({"count": len(results), "next": None, "previous": None, "results": results})
