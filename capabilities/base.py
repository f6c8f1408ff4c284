"""The contract between the engine and everything a step can do (SPEC §5).

A *capability* is one thing the platform can do, with its risk and side
effects. An *action* is what a step names; its handler receives an
:class:`ActionContext` and the rendered, validated config and returns an
:class:`Envelope`. Handlers know nothing about retries, timeouts, gates or
budgets: the executor owns those.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

logger = logging.getLogger(__name__)


class Risk(enum.IntEnum):
    LOW = 0
    MEDIUM = 1
    HIGH = 2
    CRITICAL = 3

    @classmethod
    def parse(cls, value: str) -> Risk:
        return cls[value.upper()]

    @property
    def label(self) -> str:
        return self.name.lower()

    def raised(self, levels: int = 1) -> Risk:
        return Risk(min(Risk.CRITICAL, self + levels))


class SideEffect(enum.StrEnum):
    READ = "read"
    WRITE = "write"
    EXTERNAL_WRITE = "external_write"
    COST_INCURRING = "cost_incurring"
    USER_VISIBLE = "user_visible"


class ErrorCode(enum.StrEnum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    CAPABILITY_NOT_FOUND = "CAPABILITY_NOT_FOUND"
    POLICY_VIOLATION = "POLICY_VIOLATION"
    APPROVAL_REQUIRED = "APPROVAL_REQUIRED"
    APPROVAL_DENIED = "APPROVAL_DENIED"
    APPROVAL_EXPIRED = "APPROVAL_EXPIRED"
    APPROVAL_INVALID = "APPROVAL_INVALID"  # signed by a retired key: it authorises nothing new
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    TIMEOUT = "TIMEOUT"
    TEMPLATE_ERROR = "TEMPLATE_ERROR"
    TEMPLATE_LIMIT = "TEMPLATE_LIMIT"
    SANDBOX_VIOLATION = "SANDBOX_VIOLATION"
    TEMPORARILY_UNAVAILABLE = "TEMPORARILY_UNAVAILABLE"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    RECOVERY_LIMIT = "RECOVERY_LIMIT"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"


RETRYABLE_CODES = frozenset({ErrorCode.TEMPORARILY_UNAVAILABLE, ErrorCode.TIMEOUT})


class StepFailure(Exception):
    """Raised by handlers (and the engine) for an expected failure with a stable code.

    ``message`` must be safe to show a user or an LLM; raw driver text goes in
    ``detail`` (logs and the audit payload only).
    """

    def __init__(self, code: str, message: str, *, retryable: bool | None = None, detail: str = ""):
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.retryable = (code in RETRYABLE_CODES) if retryable is None else retryable
        self.detail = detail


class AwaitingApproval(Exception):
    """Raised out of a handler when something it asked to do waits for a human (an
    ``agent_task`` tool call the gate sent for approval): the engine parks the run,
    keeping the handler's saved state for when it resumes."""

    def __init__(self, approval_id: str | None):
        super().__init__(f"waiting for approval {approval_id}")
        self.approval_id = approval_id


class CostMeter:
    """What a step spends, checked against the run's budget (SPEC §7.2, §10).

    ``check()`` before each cost-incurring call refuses once nothing is left;
    ``charge()`` records a cost and then refuses if the run is over its
    budget. Both raise ``BUDGET_EXCEEDED``; ``total`` keeps what was charged
    either way, so the step and the run still account for it.
    """

    def __init__(self, *, spent_before: Decimal = Decimal(0), budget: Decimal | None = None):
        self.spent_before = spent_before
        self.budget = budget
        self.total = Decimal(0)
        self.charges: list[tuple[str, Decimal]] = []
        self.usage: dict[str, int] = {}

    @property
    def spent(self) -> Decimal:
        return self.spent_before + self.total

    def _exceeded(self) -> StepFailure:
        return StepFailure(ErrorCode.BUDGET_EXCEEDED,
                           f"the run's budget of ${self.budget} is used up (${self.spent} spent)", retryable=False)  # fmt: skip

    def check(self) -> None:
        if self.budget is not None and self.spent >= self.budget:
            raise self._exceeded()

    def charge(self, usd: Decimal, what: str = "", *, usage: Mapping[str, int] | None = None) -> None:
        """Record ``usd`` (and what was consumed, e.g. tokens); then refuse if over budget."""
        if usd < 0:
            raise ValueError("a charge cannot be negative")
        self.total += usd
        self.charges.append((what, usd))
        for name, count in (usage or {}).items():
            self.usage[name] = self.usage.get(name, 0) + int(count)
        if self.budget is not None and self.spent > self.budget:
            raise self._exceeded()


@dataclass
class Envelope:
    """Every step's result: ``{ok, summary, data, error: {code, message, retryable}}``."""

    ok: bool
    summary: str = ""
    data: Any = None
    error: dict[str, Any] | None = None
    cost_usd: Decimal = Decimal("0")
    # A handler that must wait (the ``wait`` action) returns when to resume;
    # the executor parks the run instead of holding a worker.
    resume_at: datetime | None = None
    # What the step consumed (e.g. LLM tokens), shown with its output.
    usage: dict[str, Any] | None = None

    @classmethod
    def success(cls, data: Any = None, summary: str = "", cost_usd: Decimal | None = None,
                usage: dict[str, Any] | None = None) -> Envelope:  # fmt: skip
        return cls(ok=True, summary=summary, data=data, cost_usd=cost_usd or Decimal("0"), usage=usage)

    @classmethod
    def failure(cls, code: str, message: str, *, retryable: bool | None = None) -> Envelope:
        retry = (code in RETRYABLE_CODES) if retryable is None else retryable
        return cls(
            ok=False, summary=message, error={"code": str(code), "message": message, "retryable": retry}
        )

    def as_dict(self) -> dict[str, Any]:
        body = {"ok": self.ok, "summary": self.summary, "data": self.data, "error": self.error}
        if self.usage:
            body["usage"] = self.usage
        return body


@dataclass(frozen=True)
class Capability:
    """What a step will do, as the gate and the recovery logic need to know it."""

    id: str
    description: str = ""
    input_schema: Mapping[str, Any] = field(default_factory=lambda: {"type": "object"})
    output_schema: Mapping[str, Any] = field(default_factory=dict)
    side_effects: frozenset[SideEffect] = frozenset()
    risk: Risk = Risk.LOW
    idempotent: bool = True
    expected_duration_seconds: float = 1.0
    cost_estimate: Callable[[Mapping[str, Any]], Decimal] | None = None
    handler: Callable[[ActionContext, Mapping[str, Any]], Envelope] | None = None
    supports_preview: bool = False

    @property
    def has_side_effects(self) -> bool:
        return bool(self.side_effects - {SideEffect.READ})

    @property
    def safe_to_retry(self) -> bool:
        """Re-running after an unknown outcome cannot duplicate a side effect."""
        return self.idempotent or not self.has_side_effects

    def estimate_cost(self, args: Mapping[str, Any]) -> Decimal:
        return self.cost_estimate(args) if self.cost_estimate else Decimal("0")


class CancelSignal(threading.Event):
    """Set by the engine when the run is cancelled while a handler runs (``ctx.cancelled``).

    A handler waits on it or checks it, or registers what interrupts its blocking call
    with :meth:`on_set` (an HTTP call shuts its sockets); callbacks run once, in the
    thread that sets the signal, and never raise into it.
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._callbacks: list[Callable[[], None]] = []

    def on_set(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Run ``callback`` when the signal is set (now, if it already is); returns a function that
        unregisters it."""
        with self._lock:
            if not self.is_set():
                self._callbacks.append(callback)
                return lambda: self._forget(callback)
        _call(callback)
        return lambda: None

    def _forget(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

    def set(self) -> None:
        with self._lock:
            if self.is_set():
                return
            super().set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            _call(callback)


def _call(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        logger.warning("a cancel callback failed", exc_info=True)


@dataclass
class ActionContext:
    """What a handler may use. Everything privileged is a resolver called at use time."""

    run_id: str
    step_id: str
    attempt: int
    workspace_id: int
    trace_id: str
    idempotency_key: str
    timeout_seconds: float
    egress_allowlist: tuple[str, ...] = ()
    # Public addresses only, whatever the allowlists say: an agent-chosen URL no human
    # approved (automations.agent_tools), redirect hops included.
    public_egress_only: bool = False
    # resolve_credential(name, destination=url | None, code_step=bool): checks the credential's
    # grants for that use (capabilities.grants) before it decrypts anything.
    resolve_credential: Callable[..., Any] | None = None
    publish_event: Callable[[str, Mapping[str, Any]], str] | None = None
    call_capability: Callable[[str, Mapping[str, Any]], Envelope] | None = None
    cancel_requested: Callable[[], bool] = lambda: False
    # Set by the engine when an operator cancels the run while this handler runs
    # (only for an action declared ``interruptible``). A long handler waits on it,
    # checks it or registers a callback, and stops: the sandbox kills its process
    # group, an HTTP call in flight is abandoned.
    cancelled: CancelSignal = field(default_factory=CancelSignal)
    # Values the engine must redact from anything it stores (credential material
    # resolved during this call is appended here by the resolver).
    secrets: list[str] = field(default_factory=list)
    preview: bool = False
    # ask_human: the answer to this step's question ({value, freetext, decided_by, timed_out}), or None.
    human_answer: Callable[[], Mapping[str, Any] | None] | None = None
    # The configured LLM client (raises LLM_NOT_CONFIGURED when there is none).
    resolve_llm: Callable[[], Any] | None = None
    # Every cost a handler incurs is charged here; the run's budget is checked on each charge.
    cost_meter: CostMeter = field(default_factory=CostMeter)
    # Call a capability as a tool: gated, approved and audited like a step calling it.
    # (tool id, args, call key unique in the step) -> Envelope; raises AwaitingApproval
    # when a human must decide, StepFailure when the step must end (denied, expired).
    call_tool: Callable[[str, Mapping[str, Any], str], Envelope] | None = None
    # A handler that may be parked mid-way keeps its progress here: ``save_state`` before
    # anything that may park, ``resume_state`` is what was saved when the run resumes.
    resume_state: Any = None
    save_state: Callable[[Any], None] = lambda state: None


@dataclass(frozen=True)
class RiskInputs:
    """What a rendered config tells the risk policy beyond its capability (SPEC §7.3).

    Only whole tokens: an HTTP method, a recipient count, a network grant. A
    step's id is a label and is never one of them.
    """

    method: str = ""
    network: bool = False


def _no_risk_inputs(config: Mapping[str, Any]) -> RiskInputs:
    return RiskInputs()


def _nobody(config: Mapping[str, Any]) -> Sequence[str]:
    return ()


def _no_message(config: Mapping[str, Any]) -> str:
    return ""


@dataclass(frozen=True)
class ActionDefinition:
    """A step's ``action``: everything the engine needs to know about it.

    The engine never compares an action's name with a literal; it asks the
    definition: how to describe a config (its capability: risk, side effects,
    idempotency, duration), what raises its risk, who it notifies, whether it
    always asks a human, what to tell an approver, whether a cancel can
    interrupt it, and — for an action that calls another capability — which one.
    """

    name: str
    description: str
    config_schema: Mapping[str, Any]
    # Describes the capability this config exercises (risk, side effects,
    # idempotency, duration) — e.g. http_request GET is a low-risk read, POST an external write.
    describe: Callable[[Mapping[str, Any]], Capability]
    handler: Callable[[ActionContext, Mapping[str, Any]], Envelope]
    # Extra checks beyond the schema at save time: yields (json-pointer-suffix, code, message).
    validate: Callable[[Mapping[str, Any]], list[tuple[str, str, str]]] | None = None
    # Tokens of the rendered config that raise its risk (method, network grant).
    risk_inputs: Callable[[Mapping[str, Any]], RiskInputs] = _no_risk_inputs
    # The people a rendered config reaches (addresses); many of them raise the risk of an external write.
    notifies: Callable[[Mapping[str, Any]], Sequence[str]] = _nobody
    # The step is a human checkpoint: always gated, never covered by a standing approval.
    always_asks_human: bool = False
    # What an approver is told, beyond the rendered config (e.g. require_approval's message).
    approver_message: Callable[[Mapping[str, Any]], str] = _no_message
    # True: a cancel reaches the running handler through ``ctx.cancelled`` within a second.
    # False (the handler cannot be stopped part-way, e.g. an email being handed over): a
    # cancel waits for the handler to return; meanwhile the API and admin show the run's
    # ``cancel_requested``.
    interruptible: bool = True
    # For an action that calls another capability (call_capability): that capability,
    # looked up in the run's workspace, and the arguments it is called with. The
    # capability then decides risk, side effects and the argument schema.
    target: Callable[[Mapping[str, Any], int], Capability | None] | None = None
    target_args: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    # Credentials it names reach code a workspace wrote (as environment): a credential's
    # grant must allow code steps (run_python, run_shell).
    credentials_to_code: bool = False
    # Where a rendered config sends its credential (http_request: its URL), checked against
    # the credential's allowed destinations; None when it sends it nowhere checkable.
    credential_destination: Callable[[Mapping[str, Any]], Any] | None = None
    # The capability ids and tool patterns a config uses besides the action itself (an
    # agent_task's tools), listed for a draft's review.
    uses: Callable[[Mapping[str, Any]], Sequence[str]] = _nobody
    # An LLM answers for it (agent_task): a draft's review flags it (cost, answers vary).
    model_driven: bool = False
    # An agent_task may call it as a tool (its config is the tool's arguments), without these keys.
    as_tool: bool = False
    tool_hidden_args: tuple[str, ...] = ()
