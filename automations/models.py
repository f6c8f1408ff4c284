"""Automations, their immutable versions, runs, step runs and domain events."""

from __future__ import annotations

import json
import uuid
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models

from workspaces.models import Workspace


class EqualityIndex(models.Index):
    """A hash index on PostgreSQL (a B-tree elsewhere), for a random key that is only ever matched
    exactly: a 4-byte hash code per row instead of the key itself, in a B-tree whose random
    inserts leave its pages a third empty (``Run.trace_id``: 77 bytes per run as a B-tree)."""

    def create_sql(self, model, schema_editor, using="", **kwargs):
        if schema_editor.connection.vendor == "postgresql":
            using = " USING hash"
        return super().create_sql(model, schema_editor, using=using, **kwargs)


class AutomationStatus(models.TextChoices):
    ACTIVE = "active"
    PAUSED = "paused"


class Automation(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="automations")
    name = models.CharField(max_length=200)
    status = models.CharField(
        max_length=16, choices=AutomationStatus.choices, default=AutomationStatus.ACTIVE
    )
    version = models.PositiveIntegerField(default=1)
    definition = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # The last *definition* editor (a new version); pausing, resuming or archiving leaves it (four-eyes).
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Archived (DELETE in the API and the admin): out of lists, its triggers off and it
    # cannot run, while its runs, steps and versions stay readable. Purging is separate.
    archived_at = models.DateTimeField(null=True, blank=True)
    archived_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Set by an apply that raised its risk (a new credential, capability, MCP tool, webhook or
    # schedule, a higher autonomy): the automation stays paused until an admin activates it.
    review_required = models.BooleanField(default=False)
    review_reasons = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        indexes = [models.Index(fields=["workspace", "name"], name="automation_ws_name_idx")]

    def __str__(self) -> str:
        return self.name


class AutomationVersion(models.Model):
    """An immutable copy of every saved definition."""

    automation = models.ForeignKey(Automation, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    definition = models.JSONField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-version"]
        constraints = [
            models.UniqueConstraint(fields=["automation", "version"], name="automation_version_unique")
        ]

    def __str__(self) -> str:
        return f"{self.automation_id} v{self.version}"


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    TIMED_OUT = "timed_out"
    NEEDS_ATTENTION = "needs_attention"


ACTIVE_RUN_STATUSES = (RunStatus.QUEUED, RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.WAITING)
FINAL_RUN_STATUSES = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.TIMED_OUT)


class Run(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # No single-column indexes on these two: the composite indexes below lead with them.
    workspace = models.ForeignKey(Workspace, on_delete=models.PROTECT, related_name="runs", db_index=False)
    automation = models.ForeignKey(Automation, on_delete=models.CASCADE, related_name="runs", db_index=False)
    automation_version = models.PositiveIntegerField()
    # The definition this run executes, when it is not its automation version's stored one (a
    # run created with an explicit definition); NULL for a dispatched run, whose definition is
    # AutomationVersion(automation, automation_version).definition. Read ``snapshot``, not this.
    snapshot_copy = models.JSONField(
        null=True, blank=True, db_column="snapshot",
        help_text="The exact definition this run executes; empty: its automation version's definition.",
    )  # fmt: skip
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.QUEUED)
    inputs = models.JSONField(default=dict, blank=True)
    trigger_type = models.CharField(max_length=16, default="manual")
    trigger_key = models.CharField(max_length=64, blank=True, default="")
    trigger_id = models.UUIDField(null=True, blank=True)
    trigger_payload = models.JSONField(default=dict, blank=True)
    triggered_by = models.CharField(max_length=200, default="system")
    # The people behind the run (user ids), for four-eyes: who ran it, who published the event
    # that started it, who rotated or owns the webhook that fired it, along an event chain.
    principal_ids = models.JSONField(default=list, blank=True)
    trace_id = models.CharField(max_length=64)  # indexed by run_trace_idx
    # Indexed only where set (run_parent_idx): most runs are no re-run.
    parent_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+", db_index=False
    )
    chain_depth = models.PositiveSmallIntegerField(default=0)
    concurrency_key = models.CharField(max_length=200, blank=True, default="")
    queue = models.CharField(max_length=32)
    # None while the run waits its turn behind others (concurrency policy "queue").
    enqueued_at = models.DateTimeField(null=True, blank=True)
    # Progress: which phase ("plan" or "on_failure") and step the run is at, and
    # the values bound by ``output_as`` so far.
    phase = models.CharField(max_length=16, default="plan")
    step_index = models.PositiveIntegerField(default=0)
    context = models.JSONField(default=dict, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.JSONField(null=True, blank=True)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    cancel_requested = models.BooleanField(default=False)
    # Which worker holds the run and until when (a dead worker's lease runs out).
    claimed_by = models.CharField(max_length=200, blank=True, default="")
    # How many times a worker took this run over from one that stopped (claim.py).
    recoveries = models.PositiveSmallIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    wake_at = models.DateTimeField(null=True, blank=True)
    # When the sweep last sent a message for this waiting run whose timer had fired (runs_sweep):
    # the next passes leave it to that message unless it went untaken for REQUEUE_AFTER.
    resent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # The run lists' keyset order (-created_at, -id): across workspaces, and in one.
            models.Index(fields=["-created_at", "-id"], name="run_created_idx"),
            models.Index(fields=["workspace", "-created_at", "-id"], name="run_ws_created_idx"),
            models.Index(fields=["automation", "-created_at", "-id"], name="run_automation_idx"),
            models.Index(fields=["workspace", "status", "-created_at", "-id"], name="run_ws_status_idx"),
            # A status across workspaces (a superuser's admin filter, the home page's failed runs).
            models.Index(fields=["status", "-created_at", "-id"], name="run_status_created_idx"),
            # The sweep's and the concurrency limit's lookups only ever ask for active runs: these two
            # hold no finished run (most of the table), and a run's last UPDATE, to a final status,
            # adds no entry to them.
            models.Index(
                fields=["status", "lease_expires_at"],
                condition=models.Q(status__in=ACTIVE_RUN_STATUSES),
                name="run_active_lease_idx",
            ),
            models.Index(
                fields=["automation", "concurrency_key", "status"],
                condition=models.Q(status__in=ACTIVE_RUN_STATUSES),
                name="run_active_concurrency_idx",
            ),
            # A trace id is only matched exactly (the admin's search).
            EqualityIndex(fields=["trace_id"], name="run_trace_idx"),
            # A run's re-runs (its page; retention clearing parent_run): only re-runs have one.
            models.Index(
                fields=["parent_run"], condition=models.Q(parent_run__isnull=False), name="run_parent_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.id} ({self.status})"

    @property
    def snapshot(self) -> dict[str, Any]:
        """The exact definition this run executes: its own copy, else its automation version's."""
        copy = self.snapshot_copy
        if copy is not None:
            return copy
        try:  # read ~10 times per run on the worker: no call but this one when known
            return self.__dict__["_version_definition"]
        except KeyError:
            definition = self.__dict__["_version_definition"] = version_definition(
                self.automation_id, self.automation_version
            )
            return definition

    @snapshot.setter
    def snapshot(self, definition: dict[str, Any]) -> None:
        """Give the run its own copy (``Run(snapshot=...)`` too): kept whatever it is."""
        self.snapshot_copy = definition
        self.__dict__.pop("_version_definition", None)

    def executes_version(self, definition: dict[str, Any]) -> None:
        """No copy: the run executes its automation version's stored ``definition`` (the caller's
        object, the automation's current one, as the copy was; remembered for this process)."""
        self.snapshot_copy = None
        self.__dict__["_version_definition"] = definition
        remember_version_definition(self.automation_id, self.automation_version, definition)


# (automation id, version) -> that version's definition as JSON text, for the runs that keep no
# copy. Versions are immutable (a changed definition is a new version, automation_update) and are
# only deleted with their automation, whose runs go with them (CASCADE), so an entry never goes
# stale. Text, parsed per run as the column was: no run can change another's dict.
_VERSION_DEFINITIONS: dict[tuple[Any, int], str] = {}
_VERSION_DEFINITIONS_MAX = 2048


def remember_version_definition(automation_id: Any, version: int, definition: dict[str, Any]) -> None:
    key = (automation_id, version)
    if key not in _VERSION_DEFINITIONS:
        if len(_VERSION_DEFINITIONS) >= _VERSION_DEFINITIONS_MAX:
            _VERSION_DEFINITIONS.clear()
        _VERSION_DEFINITIONS[key] = json.dumps(definition, cls=DjangoJSONEncoder)


def version_definition(automation_id: Any, version: int) -> dict[str, Any]:
    """Version ``version`` of the automation's definition: from this process's cache, else one query."""
    try:
        return json.loads(_VERSION_DEFINITIONS[automation_id, version])
    except KeyError:
        stored = AutomationVersion.objects.filter(automation_id=automation_id, version=version)
        definition = stored.values_list("definition", flat=True).first()
        if definition is None:  # an automation written without its version row: its current
            # definition is still that version's while its version number has not moved on
            current = Automation.objects.filter(pk=automation_id, version=version)
            definition = current.values_list("definition", flat=True).first()
        if definition is None:
            raise LookupError(
                f"automation {automation_id} has no stored version {version} for a run without a copy"
            )
        remember_version_definition(automation_id, version, definition)
        return definition


class StepStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    AWAITING_APPROVAL = "awaiting_approval"
    WAITING = "waiting"  # a wait step whose timer is pending
    CANCELLED = "cancelled"  # interrupted by a cancel while it ran


class StepRun(models.Model):
    # No single-column index: steprun_unique leads with run.
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="steps", db_index=False)
    phase = models.CharField(max_length=16, default="plan")
    index = models.PositiveIntegerField()
    step_id = models.CharField(max_length=64)
    action = models.CharField(max_length=64)
    status = models.CharField(max_length=20, choices=StepStatus.choices, default=StepStatus.PENDING)
    attempt = models.PositiveIntegerField(default=0)
    idempotency_key = models.CharField(max_length=64, blank=True, default="")
    rendered_config = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error_code = models.CharField(max_length=32, blank=True, default="")
    error_message = models.CharField(max_length=500, blank=True, default="")
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    # A handler's progress while the run is parked mid-step (an agent_task's conversation
    # while one of its tool calls waits for approval); cleared when the step ends.
    checkpoint = models.JSONField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["run", "phase", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "phase", "index"], name="steprun_unique")]

    def __str__(self) -> str:
        return f"{self.step_id} ({self.status})"

    @property
    def duration_ms(self) -> float | None:
        if self.started_at and self.finished_at:
            return (self.finished_at - self.started_at).total_seconds() * 1000
        return None


class DispatchKey(models.Model):
    """Dedupe record: an idempotency key or a schedule slot, scoped to its trigger, kept 24 h."""

    scope = models.CharField(max_length=80)
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64, blank=True, default="")
    run = models.ForeignKey(Run, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["scope", "key"], name="dispatch_key_unique")]
        indexes = [models.Index(fields=["expires_at"], name="dispatch_key_expiry_idx")]

    def __str__(self) -> str:
        return f"{self.scope}:{self.key}"


class DomainEvent(models.Model):
    """The event bus table. Only automations/events.py touches it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=128)
    source = models.CharField(max_length=200, default="api")
    payload = models.JSONField(default=dict, blank=True)
    trace_id = models.CharField(max_length=64)
    chain_depth = models.PositiveSmallIntegerField(default=0)
    parent_run_id = models.UUIDField(null=True, blank=True)
    principal_ids = models.JSONField(default=list, blank=True)  # the people behind it (see Run)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    # POST /events' Idempotency-Key, unique per workspace while the event is kept.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)
    request_hash = models.CharField(max_length=64, blank=True, default="")
    # Delivery to the subscribers (at least once): sent_at is when a delivery was
    # last queued, delivered_at when every subscriber had it; the relay re-sends
    # the ones a lost broker message left behind.
    sent_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    delivery_attempts = models.PositiveSmallIntegerField(default=0)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["workspace", "event_type", "-created_at"], name="event_type_idx"),
            models.Index(fields=["expires_at"], name="event_expiry_idx"),
            models.Index(
                fields=["sent_at"],
                condition=models.Q(delivered_at__isnull=True),
                name="event_undelivered_idx",
            ),  # fmt: skip
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "idempotency_key"],
                condition=models.Q(idempotency_key__isnull=False),
                name="event_idempotency_key_uniq",
            )  # fmt: skip
        ]

    def __str__(self) -> str:
        return self.event_type


class DraftStatus(models.TextChoices):
    READY = "ready"
    SAVED = "saved"
    DISCARDED = "discarded"


class Draft(models.Model):
    """A definition an LLM proposed from a sentence (SPEC §10): transient until a human saves it.

    Nothing here runs: a draft becomes an automation (or a new version of
    ``automation``) only through ``authoring.draft_save``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="drafts")
    automation = models.ForeignKey(
        Automation, null=True, blank=True, on_delete=models.CASCADE, related_name="drafts",
        help_text="the automation this draft edits; after saving, the automation it saved to",
    )  # fmt: skip
    base_version = models.PositiveIntegerField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=DraftStatus.choices, default=DraftStatus.READY)
    prompt = models.TextField()
    prompt_sha256 = models.CharField(max_length=64)
    model = models.CharField(max_length=200)
    definition = models.JSONField()
    rounds = models.PositiveSmallIntegerField(default=1)
    summary = models.TextField(blank=True)
    flags = models.JSONField(default=list)
    diff = models.TextField(blank=True)
    usage = models.JSONField(default=dict)
    cost_usd = models.DecimalField(max_digits=12, decimal_places=6, default=Decimal("0"))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    saved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    saved_version = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"draft {self.pk}"
