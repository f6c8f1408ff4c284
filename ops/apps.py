from __future__ import annotations

from django.apps import AppConfig


class OpsConfig(AppConfig):
    name = "ops"
    verbose_name = "Operations"

    def ready(self) -> None:
        # Celery lifecycle signals (worker ready/shutdown, beat start) are how a
        # process announces that it is alive; they carry no business logic.
        from config import tracing

        from . import checks, heartbeats  # noqa: F401 - checks registers the deploy checks

        heartbeats.connect()
        tracing.configure()  # nothing unless OTEL_EXPORTER_OTLP_ENDPOINT is set
