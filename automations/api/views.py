"""Thin views: parse input, call a service, shape the output."""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from capabilities.builtin import emit_event
from config.errors import InvalidArgument, ServiceError
from config.openapi import errors
from config.pagination import RunPagination
from workspaces.api import require, workspace_for_write
from workspaces.models import Permission

from .. import as_code, cases, events, selectors, services
from .. import definition as defs
from ..dispatcher import DispatchResult, request_hash
from ..models import Run
from .serializers import (
    AutomationOut,
    AutomationQuery,
    AutomationReplace,
    AutomationVersionOut,
    AutomationWrite,
    EventAccepted,
    EventIn,
    RerunIn,
    ResolveIn,
    RunAccepted,
    RunListOut,
    RunOut,
    RunQuery,
    dispatch_body,
    run_accepted,
)

MAX_BODY_BYTES = 1024 * 1024


def _check_body_size(request) -> None:
    if len(request.body) > MAX_BODY_BYTES:
        raise ServiceError("PAYLOAD_TOO_LARGE", "request body is too large", 413)


_IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", str, OpenApiParameter.HEADER, required=False,
    description="the same key with the same body answers 200 with the original; another body 422",
)  # fmt: skip


def _dispatch_response(result: DispatchResult) -> Response:
    body, status_code = dispatch_body(result)
    return Response(body, status=status_code)


@extend_schema(parameters=[AutomationQuery], methods=["GET"])
class AutomationList(generics.ListAPIView):
    serializer_class = AutomationOut

    def get_queryset(self):
        query = AutomationQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        return selectors.automations_listed_for(
            self.request.user, archived=query.validated_data["archived"]
        ).order_by("name", "id")

    @extend_schema(request=AutomationWrite, responses={201: AutomationOut, **errors(404)})
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
        if data.validated_data.get("workspace", automation.workspace.slug) != automation.workspace.slug:
            raise InvalidArgument(
                [
                    {
                        "path": "/workspace",
                        "code": "immutable",
                        "message": "an automation cannot move to another workspace",
                    }
                ]
            )
        automation = services.automation_update(
            automation=automation, user=request.user,
            definition=data.validated_data.get("definition"), status=data.validated_data.get("status"),
        )  # fmt: skip
        return Response(AutomationOut(automation).data)

    @extend_schema(request=AutomationReplace, responses=AutomationOut)
    def put(self, request, pk):
        return self._write(request, partial=False)

    @extend_schema(request=AutomationWrite, responses=AutomationOut)
    def patch(self, request, pk):
        return self._write(request, partial=True)

    @extend_schema(
        responses={204: None, **errors(404, 409)},
        summary="Archive: out of lists, triggers off, cannot run; its runs, steps and versions stay readable",
    )
    def delete(self, request, pk):
        automation = self.get_object()
        require(request.user, automation.workspace_id, Permission.OPERATE)
        services.automation_archive(automation=automation, user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class AutomationExport(APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, **errors(404)},
        summary="The automation as a file of definitions as code: the same JSON object `automations export` writes",
    )
    def get(self, request, pk):
        automation = get_object_or_404(selectors.automations_visible_to(request.user), pk=pk)
        text = as_code.document_text(as_code.automation_document(automation))
        return HttpResponse(text.encode(), content_type="application/json")


APPLY_MAX_BODY_BYTES = 16 * MAX_BODY_BYTES


class AutomationApply(APIView):
    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={200: OpenApiTypes.OBJECT, **errors(403, 404, 409)},
        summary="Apply documents (as `automations apply`): "
        '{"workspace"?, "automations": [...], "dry_run", "prune"?}; answers the plan',
    )
    def post(self, request):
        if len(request.body) > APPLY_MAX_BODY_BYTES:
            raise ServiceError("PAYLOAD_TOO_LARGE", "request body is too large", 413)
        body = request.data
        problems = []
        if not isinstance(body, dict):
            raise ServiceError("INVALID_ARGUMENT", "the body must be a JSON object")
        unknown = sorted(set(body) - {"workspace", "automations", "dry_run", "prune"})
        problems += [
            {"path": f"/{key}", "code": "unknown_key", "message": f"unknown key '{key}'"} for key in unknown
        ]
        if not isinstance(body.get("automations"), list):
            problems.append({"path": "/automations", "code": "required", "message": "a list of documents"})
        for key in ("dry_run", "prune"):
            if not isinstance(body.get(key, False), bool):
                problems.append(
                    {"path": f"/{key}", "code": "invalid_type", "message": f"{key} is true or false"}
                )
        workspace_slug = body.get("workspace")
        if workspace_slug is not None and not isinstance(workspace_slug, str):
            problems.append({"path": "/workspace", "code": "invalid_type", "message": "a workspace slug"})
        if problems:
            raise InvalidArgument(problems)
        workspace = workspace_for_write(request, workspace_slug, Permission.OPERATE)
        sources = [
            as_code.Source(name=f"automations/{i}", document=document)
            for i, document in enumerate(body["automations"])
        ]
        plan = as_code.apply_documents(
            workspace=workspace, sources=sources, user=request.user,
            dry_run=body.get("dry_run", False), prune=body.get("prune", False),
        )  # fmt: skip
        return Response(plan)


class AutomationActivate(APIView):
    @extend_schema(
        request=None,
        responses={200: AutomationOut, **errors(403, 404, 409)},
        summary="Admins: activate an automation an apply paused for review",
    )
    def post(self, request, pk):
        automation = get_object_or_404(selectors.automations_visible_to(request.user), pk=pk)
        require(request.user, automation.workspace_id, Permission.ADMINISTER)
        automation = services.automation_review_activate(automation=automation, user=request.user)
        return Response(AutomationOut(automation).data)


class AutomationVersions(generics.ListAPIView):
    serializer_class = AutomationVersionOut

    def get_queryset(self):
        automation = get_object_or_404(
            selectors.automations_visible_to(self.request.user), pk=self.kwargs["pk"]
        )
        return automation.versions.order_by("-version")


class AutomationRun(APIView):
    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        responses={202: RunAccepted, 200: RunAccepted, **errors(409, 422)},
        parameters=[_IDEMPOTENCY_KEY],
        summary="Run now: the body is the run's inputs",
    )
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


@extend_schema(parameters=[RunQuery], summary="Runs in your workspaces (newest first)")
class RunList(generics.ListAPIView):
    serializer_class = RunListOut
    pagination_class = RunPagination

    def get_queryset(self):
        query = RunQuery(data=self.request.query_params)
        query.is_valid(raise_exception=True)
        runs = selectors.runs_visible_to(self.request.user)
        if automation := query.validated_data.get("automation"):
            runs = runs.filter(automation_id=automation)
        if run_status := query.validated_data.get("status"):
            runs = runs.filter(status=run_status)
        return runs


class RunDetail(generics.RetrieveAPIView):
    serializer_class = RunOut

    def get_queryset(self):
        return selectors.runs_visible_to(self.request.user).prefetch_related("steps")


class RunTestCase(APIView):
    @extend_schema(
        responses={200: OpenApiTypes.OBJECT, **errors(404, 409)},
        summary="A finished run as a test case (as `automations record`), for `automations test`",
    )
    def get(self, request, pk):
        run = get_object_or_404(
            selectors.runs_visible_to(request.user).select_related("automation__workspace"), pk=pk
        )
        return Response(cases.run_test_case(run))


class _RunAction(APIView):
    def run(self, request, pk) -> Run:
        run = get_object_or_404(selectors.runs_visible_to(request.user), pk=pk)
        require(request.user, run.workspace_id, Permission.OPERATE)
        return run


class RunCancel(_RunAction):
    @extend_schema(request=None, responses={200: RunOut, **errors(409)})
    def post(self, request, pk):
        run = services.run_cancel(run=self.run(request, pk), user=request.user)
        return Response(RunOut(run).data)


class RunRerun(_RunAction):
    @extend_schema(request=RerunIn, responses={202: RunAccepted, **errors(409)})
    def post(self, request, pk):
        data = RerunIn(data=request.data or {})
        data.is_valid(raise_exception=True)
        new = services.run_rerun(run=self.run(request, pk), user=request.user,
                                 from_step=data.validated_data.get("from_step"))  # fmt: skip
        return Response(run_accepted(new), status=202)


class RunResolve(_RunAction):
    @extend_schema(request=ResolveIn, responses={200: RunOut, **errors(409)})
    def post(self, request, pk):
        data = ResolveIn(data=request.data)
        data.is_valid(raise_exception=True)
        run = services.run_resolve(run=self.run(request, pk), user=request.user, **data.validated_data)
        return Response(RunOut(run).data)


class EventPublish(APIView):
    @extend_schema(
        request=EventIn,
        responses={202: EventAccepted, 200: EventAccepted, **errors(404, 409, 422)},
        parameters=[_IDEMPOTENCY_KEY],
        summary="Publish an event (a repeated Idempotency-Key answers 200 with the same event_id)",
    )
    def post(self, request):
        _check_body_size(request)
        data = EventIn(data=request.data)
        data.is_valid(raise_exception=True)
        if emit_event.reserved_event_type(data.validated_data["event_type"]):
            raise InvalidArgument([{"path": "/event_type", "code": "reserved_event_type",
                                    "message": emit_event.RESERVED_MESSAGE}])  # fmt: skip
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

    @extend_schema(responses=OpenApiTypes.OBJECT, summary="JSON Schema of an automation definition")
    def get(self, request):
        return Response(defs.definition_json_schema())


class FilterSchema(APIView):
    permission_classes = [AllowAny]

    @extend_schema(responses=OpenApiTypes.OBJECT, summary="JSON Schema of an event filter")
    def get(self, request):
        return Response(defs.filter_json_schema())
