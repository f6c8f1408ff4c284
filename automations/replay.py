"""Replaying a recorded case (issue 34, ``automations test``): recorded outputs stand in for calls.

While a :class:`Replay` is active (``with replay.active(r):``), the executor asks it instead of
calling the handler of any step that reaches outside the run (an HTTP request, an email, a
capability or MCP tool, an agent, a code step, an event). The steps that only compute —
``transform_data``, ``wait``, ``require_approval`` — and everything around every step (templates,
``when``, ``output_as``, gates, policies, retries) run for real. Nothing here imports the executor.
"""

from __future__ import annotations

import contextvars
import copy
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from capabilities.base import Envelope

# Steps that compute inside the run: run for real in a replay.
RUN_FOR_REAL = frozenset({"transform_data", "wait", "require_approval"})

_current: contextvars.ContextVar[Replay | None] = contextvars.ContextVar("autoplane_replay", default=None)


class Replay:
    def __init__(self, steps: Mapping[str, Mapping[str, Any]]):
        self.steps = steps
        self.sent: dict[str, Any] = {}  # step_id -> the rendered config the step would have sent

    def stands_in(self, step: Mapping[str, Any]) -> bool:
        return step.get("action") not in RUN_FOR_REAL

    def call(self, step: Mapping[str, Any], config: Any) -> Envelope:
        step_id = str(step["step_id"])
        self.sent[step_id] = copy.deepcopy(config)
        recorded = self.steps.get(step_id)
        if recorded is None:
            return Envelope.failure("NOT_RECORDED", f"the case has no recorded output for step '{step_id}'",
                                    retryable=False)  # fmt: skip
        if recorded.get("status") == "failed":
            error = recorded.get("error") or {}
            return Envelope.failure(str(error.get("code") or "INTERNAL"), str(error.get("message") or "recorded failure"),
                                    retryable=False)  # fmt: skip
        return Envelope(
            ok=True, summary=str(recorded.get("summary") or ""), data=copy.deepcopy(recorded.get("output"))
        )


def current() -> Replay | None:
    return _current.get()


@contextmanager
def active(replay: Replay) -> Iterator[Replay]:
    token = _current.set(replay)
    try:
        yield replay
    finally:
        _current.reset(token)
