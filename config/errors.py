"""The one error type of the platform's services (SPEC §11).

A service that refuses an operation raises :class:`ServiceError` (or an app's
subclass of it) with a stable ``code``, a ``message`` safe to show a user, and
the HTTP status an API answers with. ``config.api_errors.exception_handler``
turns it into the error envelope once, for every view; admin actions and
commands show ``message``. Nothing here imports Django or any app, so every
layer may raise it (``config`` is the project package beneath every app, as
``config.settings`` and ``config.celery`` already are).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class ServiceError(Exception):
    """A refused operation: ``{"error": {code, message}}`` with ``http_status``.

    ``errors`` (a list of ``{path, code, message}``) makes the API answer
    ``{"errors": [...]}`` instead; ``headers`` are added to the response
    (``Retry-After``, ``WWW-Authenticate``).
    """

    default_status = 400

    def __init__(
        self,
        code: str,
        message: str,
        http_status: int | None = None,
        *,
        errors: Sequence[Mapping[str, Any]] | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.http_status = self.default_status if http_status is None else http_status
        self.errors = [dict(e) for e in errors] if errors else None
        self.headers = dict(headers or {})


class InvalidArgument(ServiceError):
    """Problems with the input, each at a JSON-pointer path: always 400 ``{"errors": [...]}``."""

    def __init__(self, errors: Sequence[Mapping[str, Any]], message: str | None = None):
        super().__init__(
            "INVALID_ARGUMENT", message or f"{len(errors)} problem(s) in the request", 400, errors=errors
        )
