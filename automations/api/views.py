"""Thin views: parse input, call a service, shape the output."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from config.errors import InvalidArgument, ServiceError
from workspaces.api import require, workspace_for_write
from workspaces.models import Permission

from .. import definition as defs
from .. import events, selectors, services
from ..dispatcher import DispatchResult, request_hash
from ..models import Run
from .serializers import (
    AutomationOut,
    AutomationVersionOut,
    AutomationWrite,
    EventIn,
    RerunIn,
    ResolveIn,
    RunListOut,
    RunOut,
)

MAX_BODY_BYTES = 1024 * 1024


def _check_body_size(request) -> None:
    if len(request.body) > MAX_BODY_BYTES:
        raise ServiceError("PAYLOAD_TOO_LARGE", "request body is too large", 413)


def _dispatch_response(result: DispatchResult) -> Response:
    if result.suppressed:
        return Response({"run_id": None, "suppressed": True, "reason": "drop_if_running"}, status=200)
    run = result.run
    body = {"run_id": str(run.pk), "status_url": f"/api/v1/runs/{run.pk}", "status": run.status}
    return Response(body, status=200 if result.deduplicated else 202)


class AutomationList(generics.ListAPIView):
    serializer_class = AutomationOut

    def get_queryset(self):
        return selectors.automations_visible_to(self.request.user).order_by("name", "id")

    @extend_schema(request=AutomationWrite, responses={201: AutomationOut})
    def post(self, request):
        _check_body_size(request)
        body = request.data
        if not isinstance(body, dict):
            raise ServiceError("INVALID_ARGUMENT", "the body must be a JSON object")
        wrapped = "definition" in body
        definition = body.get("definition") if wrapped else body
        workspace = workspace_for_write(
            request, body.get("workspace") if wrapped else None, Permission.OPERATE
        )
        automation = services.automation_create(
            workspace=workspace, definition=definition, user=request.user,
            status=body.get("status") if wrapped else None,
        )  # fmt: skip
        return Response(AutomationOut(automation).data, status=status.HTTP_201_CREATED)


class AutomationDetail(generics.RetrieveAPIView):
    serializer_class = AutomationOut

    def get_queryset(self):
        return selectors.automations_visible_to(self.request.user)

    def _write(self, request, partial: bool):
        _check_body_size(request)
        automation = self.get_object()
        require(request.user, automation.workspace_id, Permission.OPERATE)
        data = AutomationWrite(data=request.data)
        data.is_valid(raise_exception=True)
        if not partial and "definition" not in data.validated_data:
            raise InvalidArgument(
                [{"path": "/definition", "code": "required", "message": "definition is required"}]
            )
        automation = services.automation_update(
            automation=automation, user=request.user,
            definition=data.validated_data.get("definition"), status=data.validated_data.get("status"),
        )  # fmt: skip
        return Response(AutomationOut(automation).data)

    @extend_schema(request=AutomationWrite, responses=AutomationOut)
    def put(self, request, pk):
        return self._write(request, partial=False)

    @extend_schema(request=AutomationWrite, responses=AutomationOut)
    def patch(self, request, pk):
        return self._write(request, partial=True)

    def delete(self, request, pk):
        automation = self.get_object()
        require(request.user, automation.workspace_id, Permission.OPERATE)
        services.automation_delete(automation=automation, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AutomationVersions(generics.ListAPIView):
    serializer_class = AutomationVersionOut

    def get_queryset(self):
        automation = get_object_or_404(
            selectors.automations_visible_to(self.request.user), pk=self.kwargs["pk"]
        )
        return automation.versions.order_by("-version")


class AutomationRun(APIView):
    @extend_schema(request=dict, responses={202: dict})
    def post(self, request, pk):
        _check_body_size(request)
        automation = get_object_or_404(selectors.automations_visible_to(request.user), pk=pk)
        require(request.user, automation.workspace_id, Permission.OPERATE)
        inputs = request.data if request.body else {}
        result = services.run_create(
            automation=automation, inputs=inputs, user=request.user,
            idempotency_key=request.headers.get("Idempotency-Key"),
        )  # fmt: skip
        return _dispatch_response(result)


class RunList(generics.ListAPIView):
    serializer_class = RunListOut

    def get_queryset(self):
        runs = selectors.runs_visible_to(self.request.user)
        params = self.request.query_params
        if params.get("automation"):
            try:
                runs = runs.filter(automation_id=params["automation"])
            except Exception:
                raise ServiceError("INVALID_ARGUMENT", "automation must be an id")
        if params.get("status"):
            runs = runs.filter(status=params["status"])
        return runs


class RunDetail(generics.RetrieveAPIView):
    serializer_class = RunOut

    def get_queryset(self):
        return selectors.runs_visible_to(self.request.user).prefetch_related("steps")


class _RunAction(APIView):
    def run(self, request, pk) -> Run:
        run = get_object_or_404(selectors.runs_visible_to(request.user), pk=pk)
        require(request.user, run.workspace_id, Permission.OPERATE)
        return run


class RunCancel(_RunAction):
    @extend_schema(request=None, responses=RunOut)
    def post(self, request, pk):
        run = services.run_cancel(run=self.run(request, pk), user=request.user)
        return Response(RunOut(run).data)


class RunRerun(_RunAction):
    @extend_schema(request=RerunIn, responses={202: dict})
    def post(self, request, pk):
        data = RerunIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        new = services.run_rerun(run=self.run(request, pk), user=request.user,
                                 from_step=data.validated_data.get("from_step"))  # fmt: skip
        return Response({"run_id": str(new.pk), "status_url": f"/api/v1/runs/{new.pk}"}, status=202)


class RunResolve(_RunAction):
    @extend_schema(request=ResolveIn, responses=RunOut)
    def post(self, request, pk):
        data = ResolveIn(data=request.data)
        data.is_valid(raise_exception=True)
        run = services.run_resolve(run=self.run(request, pk), user=request.user, **data.validated_data)
        return Response(RunOut(run).data)


class EventPublish(APIView):
    @extend_schema(request=EventIn, responses={202: dict})
    def post(self, request):
        _check_body_size(request)
        data = EventIn(data=request.data)
        data.is_valid(raise_exception=True)
        workspace = workspace_for_write(request, data.validated_data.get("workspace"), Permission.OPERATE)
        key = request.headers.get("Idempotency-Key")
        published = events.publish_event(
            workspace_id=workspace.id, event_type=data.validated_data["event_type"],
            payload=data.validated_data["payload"], source="api", actor=f"user:{request.user.get_username()}",
            idempotency_key=key, request_hash=request_hash(request.data) if key is not None else "",
            principal_ids=[request.user.pk],
        )  # fmt: skip
        return Response({"event_id": published.event_id}, status=202 if published.created else 200)


class DefinitionSchema(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses=dict)
    def get(self, request):
        return Response(defs.definition_json_schema())


class FilterSchema(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses=dict)
    def get(self, request):
        return Response(defs.filter_json_schema())
