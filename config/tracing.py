"""OpenTelemetry traces, off unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set.

When on, every process exports spans over OTLP/HTTP with the standard ``OTEL_*``
variables (``OTEL_SERVICE_NAME``, headers, sampler...), and the maintained
instrumentations do the plumbing: Django (a caller's W3C ``traceparent`` on a
webhook or API request becomes the parent), Celery (the context rides in each
task message, so a run executed by a worker continues the trace of the fire
that queued it) and httpx (an ``http_request`` step's call carries
``traceparent``). The engine adds a ``run`` span around a worker's execution
of a run and a ``step <step_id>`` span around each handler call; both carry the
run's own ``autoplane.trace_id`` (the id in the audit ledger and the API), which
stays the platform's id: the OTel trace id is the caller's when it sent one.

When off, :func:`span` is a ``nullcontext`` and nothing is imported beyond the API.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import trace

ENABLED = bool(
    os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
)
_configured = False
tracer = trace.get_tracer("autoplane")


def configure(*, exporter: Any = None) -> bool:
    """Install the tracer provider and the instrumentations once per process; False when off.

    ``exporter`` replaces the OTLP exporter (tests pass an in-memory one)."""
    global _configured, ENABLED
    if _configured or not (ENABLED or exporter is not None):
        return _configured
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider(
        resource=Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "autoplane")})
    )
    if exporter is None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    else:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    DjangoInstrumentor().instrument()
    CeleryInstrumentor().instrument()
    HTTPXClientInstrumentor().instrument()
    _configured = ENABLED = True
    return True


def span(name: str, **attributes: Any) -> AbstractContextManager:
    """A span when tracing is on; nothing at all when it is off."""
    if not ENABLED:
        return nullcontext()
    return tracer.start_as_current_span(
        name, attributes={k: v for k, v in attributes.items() if v is not None}
    )
