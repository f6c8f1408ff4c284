from __future__ import annotations

from rest_framework import serializers

from ..models import Automation, AutomationVersion, Run, StepRun


class AutomationOut(serializers.ModelSerializer):
    workspace = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Automation
        fields = ["id", "name", "status", "version", "definition", "workspace", "created_at", "updated_at"]


class AutomationVersionOut(serializers.ModelSerializer):
    class Meta:
        model = AutomationVersion
        fields = ["version", "definition", "created_at"]


class StepOut(serializers.ModelSerializer):
    error = serializers.SerializerMethodField()
    duration_ms = serializers.FloatField(read_only=True)
    config = serializers.JSONField(source="rendered_config")

    class Meta:
        model = StepRun
        fields = ["step_id", "phase", "action", "status", "attempt", "config", "output", "error",
                  "cost_usd", "started_at", "finished_at", "duration_ms"]  # fmt: skip

    def get_error(self, step: StepRun):
        return {"code": step.error_code, "message": step.error_message} if step.error_code else None


class RunOut(serializers.ModelSerializer):
    automation = serializers.UUIDField(source="automation_id")
    workspace = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    steps = serializers.SerializerMethodField()

    class Meta:
        model = Run
        fields = ["id", "automation", "automation_version", "workspace", "status", "trigger_type", "trigger_key",
                  "triggered_by", "inputs", "steps", "output", "error", "cost_usd", "trace_id", "parent_run",
                  "queue", "created_at", "started_at", "finished_at"]  # fmt: skip

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


class AutomationWrite(serializers.Serializer):
    definition = serializers.JSONField(required=False)
    status = serializers.ChoiceField(choices=["active", "paused"], required=False)
    workspace = serializers.SlugField(required=False)


class RerunIn(serializers.Serializer):
    from_step = serializers.CharField(required=False, max_length=64)


class ResolveIn(serializers.Serializer):
    resolution = serializers.ChoiceField(choices=["succeeded", "retry", "failed"])
    reason = serializers.CharField(required=False, allow_blank=True, max_length=1000, default="")
    output = serializers.JSONField(required=False)


class EventIn(serializers.Serializer):
    event_type = serializers.RegexField(r"^[a-z0-9_.-]{1,128}$")
    payload = serializers.DictField(required=False, default=dict)
    workspace = serializers.SlugField(required=False)
