"""Logs a machine can read: ``LOG_FORMAT=json`` gives one JSON object per line (docs/operations.md).

Each object has ``ts`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``,
the fields bound for what the process is doing (``run_id``, ``trace_id``,
``workspace``, ``step_id`` while a worker executes a run: :func:`bound`), any
``extra=`` the call passed, and ``exc`` with the traceback. Plain text stays the
default for a terminal. Under ``manage.py up`` each child's line gets a
``process`` field (``web``, ``worker-fast``...), and a line a child printed that
is not JSON (gunicorn's own start-up lines) is wrapped as the ``message`` of one.

Standard library only: a formatter is all this needs.
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

_bound: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "autoplane_log_fields", default=None
)

# LogRecord's own attributes: everything else on a record came from ``extra=``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


@contextmanager
def bound(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line of this thread (or task) inside the block."""
    token = _bound.set({**(_bound.get() or {}), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _bound.reset(token)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_bound.get() or {})
        entry.update(
            {k: v for k, v in record.__dict__.items() if k not in _STANDARD and not k.startswith("_")}
        )
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        return json.dumps(entry, default=str, ensure_ascii=False)


def json_line(process: str, line: str, *, level: str = "INFO") -> str:
    """One JSON line for ``up``'s output: a child's JSON line gains ``process``; other text is wrapped."""
    text = line.rstrip("\n")
    try:
        entry = json.loads(text)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        entry = {"ts": _iso(datetime.now(UTC).timestamp()), "level": level, "logger": "up", "message": text}
    return json.dumps({**entry, "process": process}, default=str, ensure_ascii=False)


def bind(**fields: Any) -> None:
    """Add or replace fields until the enclosing :func:`bound` block ends (e.g. the current step)."""
    _bound.set({**(_bound.get() or {}), **fields})
