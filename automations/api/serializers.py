from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from config.openapi import ErrorDetail

from .. import selectors
from ..dispatcher import DispatchResult
from ..models import Automation, AutomationStatus, AutomationVersion, Run, RunStatus, StepRun

if TYPE_CHECKING:
    from workspaces.models import Workspace


class NoticeOut(serializers.Serializer):
    code = serializers.CharField(help_text="autonomy_clamped | approvals_raised")
    path = serializers.CharField(help_text="JSON pointer into the definition")
    message = serializers.CharField()


class AutomationOut(serializers.ModelSerializer):
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    effective_autonomy = serializers.SerializerMethodField(
        help_text="the autonomy its steps are gated at now: execution.autonomy (else the workspace's "
        "default_autonomy), never above the workspace's max_autonomy"
    )
    notices = serializers.SerializerMethodField(
        help_text="what the workspace's ceilings change about this definition (saved as written, gated "
        "within the ceilings); empty when nothing"
    )

    class Meta:
        model = Automation
        fields = ["id", "name", "status", "version", "definition", "workspace", "effective_autonomy", "notices",
                  "review_required", "review_reasons", "created_at", "updated_at", "archived_at"]  # fmt: skip
        extra_kwargs = {
            "archived_at": {"help_text": "set when the automation was archived (DELETE)"},
            "review_required": {"help_text": "an apply raised its risk: paused until an admin activates it"},
        }

    def get_effective_autonomy(self, automation: Automation) -> str:
        return selectors.definition_autonomy(automation.definition, automation.workspace)

    @extend_schema_field(NoticeOut(many=True))
    def get_notices(self, automation: Automation):
        return selectors.ceiling_notices(automation.definition, automation.workspace)


class AutomationVersionOut(serializers.ModelSerializer):
    class Meta:
        model = AutomationVersion
        fields = ["version", "definition", "created_at"]


class StepOut(serializers.ModelSerializer):
    error = serializers.SerializerMethodField()
    duration_ms = serializers.FloatField(read_only=True, allow_null=True)
    config = serializers.JSONField(source="rendered_config")

    class Meta:
        model = StepRun
        fields = ["step_id", "phase", "action", "status", "attempt", "config", "output", "error",
                  "cost_usd", "started_at", "finished_at", "duration_ms"]  # fmt: skip

    @extend_schema_field(ErrorDetail(allow_null=True))
    def get_error(self, step: StepRun):
        return {"code": step.error_code, "message": step.error_message} if step.error_code else None


class RunOut(serializers.ModelSerializer):
    automation = serializers.UUIDField(source="automation_id")
    workspace: serializers.SlugRelatedField[Workspace] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    steps = serializers.SerializerMethodField()
    cancel_requested = serializers.BooleanField(
        read_only=True,
        help_text="A cancel was asked for. While the run is still `running`, its current step cannot be "
        "interrupted and finishes first; the run then ends `cancelled`.",
    )

    class Meta:
        model = Run
        fields = ["id", "automation", "automation_version", "workspace", "status", "cancel_requested",
                  "trigger_type", "trigger_key", "triggered_by", "inputs", "steps", "output", "error", "cost_usd",
                  "trace_id", "parent_run", "queue", "created_at", "started_at", "finished_at"]  # fmt: skip

    @extend_schema_field(StepOut(many=True))
    def get_steps(self, run: Run):
        """Every plan step in order (pending ones included), then on_failure steps that ran."""
        rows = {(s.phase, s.index): s for s in run.steps.all()}
        out = []
        for index, step in enumerate(run.snapshot["plan"]):
            row = rows.get(("plan", index))
            if row is None:
                row = StepRun(
                    run=run, phase="plan", index=index, step_id=step["step_id"], action=step["action"]
                )
            out.append(StepOut(row).data)
        for (phase, _), row in sorted(rows.items()):
            if phase == "on_failure":
                out.append(StepOut(row).data)
        return out


class RunListOut(serializers.ModelSerializer):
    automation = serializers.UUIDField(source="automation_id")

    class Meta:
        model = Run
        fields = ["id", "automation", "status", "trigger_type", "error", "cost_usd", "trace_id",
                  "created_at", "started_at", "finished_at"]  # fmt: skip


class StrictSlugField(serializers.SlugField):
    """A slug given as a JSON string: DRF's CharField would take the number 0 as "0"."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class AutomationWrite(serializers.Serializer):
    definition = serializers.JSONField(required=False)
    status = serializers.ChoiceField(choices=AutomationStatus.choices, required=False)
    workspace = StrictSlugField(
        required=False,
        help_text="on create: the workspace; on update: only its own (automations do not move)",
    )


class AutomationReplace(AutomationWrite):
    definition = serializers.JSONField()


class AutomationQuery(serializers.Serializer):
    archived = serializers.BooleanField(
        required=False, default=False, help_text="true: only archived automations (default: only live ones)"
    )


class RunQuery(serializers.Serializer):
    automation = serializers.UUIDField(required=False, help_text="runs of this automation")
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False, allow_blank=True)

    def validate(self, attrs):
        # A query string's blank value would otherwise read as "no filter"; an id is an id.
        if self.initial_data.get("automation") == "":
            raise serializers.ValidationError({"automation": "must be an automation id"})
        return attrs


class RerunIn(serializers.Serializer):
    from_step = serializers.CharField(required=False, max_length=64)


class ResolveIn(serializers.Serializer):
    resolution = serializers.ChoiceField(choices=["succeeded", "retry", "failed"])
    reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")
    output = serializers.JSONField(required=False)


class EventIn(serializers.Serializer):
    event_type = serializers.RegexField(r"^[a-z0-9_.-]{1,128}$")
    payload = serializers.DictField(required=False, default=dict)
    workspace = StrictSlugField(required=False)


class RunAccepted(serializers.Serializer):
    """What ``run``, ``fire`` and ``rerun`` answer (SPEC §11)."""

    run_id = serializers.UUIDField(allow_null=True, help_text="null when drop_if_running suppressed it")
    status_url = serializers.CharField(required=False, help_text="GET it to follow the run")
    status = serializers.ChoiceField(choices=RunStatus.choices, required=False)
    suppressed = serializers.BooleanField(required=False)
    reason = serializers.CharField(required=False, help_text="why it was suppressed")


def run_accepted(run: Run) -> dict:
    return {"run_id": str(run.pk), "status_url": f"/api/v1/runs/{run.pk}", "status": run.status}


def dispatch_body(result: DispatchResult) -> tuple[dict, int]:
    """The body and status of a dispatch: 202 new, 200 deduplicated or suppressed."""
    if result.suppressed:
        return {"run_id": None, "suppressed": True, "reason": "drop_if_running"}, 200
    assert result.run is not None  # only a suppressed dispatch has no run
    return run_accepted(result.run), 200 if result.deduplicated else 202


class EventAccepted(serializers.Serializer):
    event_id = serializers.CharField()
