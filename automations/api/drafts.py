"""``/drafts``: automations drafted from a sentence, reviewed, saved by a person (SPEC §10).

Every endpoint here is an LLM feature: without ``LLM_BASE_URL``/``LLM_MODEL``
each answers 503 ``LLM_NOT_CONFIGURED``. Errors are ``ServiceError``s from the
service, turned into the envelope by the API exception handler.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from capabilities import llm
from config.errors import ServiceError
from config.openapi import errors
from workspaces.api import workspace_for_write
from workspaces.models import Permission, Workspace

from .. import selectors
from ..authoring import drafts
from ..models import Draft
from .serializers import AutomationOut


class DraftIn(serializers.Serializer):
    prompt = serializers.CharField(max_length=drafts.MAX_PROMPT_CHARS, trim_whitespace=True)
    automation = serializers.UUIDField(
        required=False, help_text="edit this automation (the draft shows a diff)"
    )
    workspace = serializers.CharField(
        required=False, help_text="workspace slug (needed if you operate several)"
    )


class DraftOut(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    validation = serializers.SerializerMethodField()

    class Meta:
        model = Draft
        fields = ["id", "workspace", "automation", "base_version", "status", "prompt", "model", "definition",
                  "validation", "summary", "flags", "diff", "usage", "cost_usd", "saved_version",
                  "created_at", "expires_at"]  # fmt: skip

    def get_validation(self, draft: Draft) -> dict:
        return {"valid": True, "rounds": draft.rounds, "errors": []}


def _draft(request, pk) -> Draft:
    draft = drafts.drafts_visible_to(request.user).filter(pk=pk).select_related("workspace").first()
    if draft is None:
        raise drafts.DraftNotFound()
    return draft


class _LlmView(APIView):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)  # authentication first: 401 before 503
        has_handler = hasattr(self, request.method.lower())  # an undeclared method stays a 405
        if has_handler and llm.llm_config() is None:
            raise llm.LlmNotConfigured()


class DraftCreate(_LlmView):
    @extend_schema(request=DraftIn, responses={201: DraftOut, **errors(404, 422, 502)})
    def post(self, request):
        data = DraftIn(data=request.data)
        data.is_valid(raise_exception=True)
        automation = None
        if "automation" in data.validated_data:
            automation = selectors.automations_visible_to(request.user).filter(
                pk=data.validated_data["automation"]).first()  # fmt: skip
            if automation is None:
                raise ServiceError("NOT_FOUND", "automation not found", 404)
            workspace = automation.workspace
        else:
            workspace = workspace_for_write(request, data.validated_data.get("workspace"), Permission.OPERATE)
        draft = drafts.draft_create(workspace=workspace, user=request.user, prompt=data.validated_data["prompt"],
                                    automation=automation)  # fmt: skip
        return Response(DraftOut(draft).data, status=status.HTTP_201_CREATED)


class DraftDetail(_LlmView):
    @extend_schema(responses=DraftOut)
    def get(self, request, pk):
        return Response(DraftOut(_draft(request, pk)).data)


class DraftSave(_LlmView):
    @extend_schema(request=None, responses={201: AutomationOut, 200: AutomationOut, **errors(400, 409)})
    def post(self, request, pk):
        draft = _draft(request, pk)
        automation = drafts.draft_save(draft=draft, user=request.user)
        created = draft.automation_id is None
        return Response(AutomationOut(automation).data, status=201 if created else 200)


class DraftDiscard(_LlmView):
    @extend_schema(request=None, responses={204: None, **errors(409)})
    def post(self, request, pk):
        drafts.draft_discard(draft=_draft(request, pk), user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
