"""OpenTelemetry: a caller's traceparent on an API fire continues through the run a real worker executes,
its steps, and the step's outgoing HTTP call; the worker exports over OTLP/HTTP to a local receiver."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.instrumentation.django import DjangoInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from automations.models import Run, RunStatus
from config import tracing
from config.celery import QUEUES
from tests.factories import definition, http_step
from tests.live import live_worker_env

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[tuple[str, bytes, dict]] = []
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    def _answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.bodies.append((self.path, body, dict(self.headers)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def web_tracing():
    """This test process plays the web server: instrumented, spans kept in memory."""
    exporter = InMemorySpanExporter()
    tracing.configure(exporter=exporter)
    yield exporter
    DjangoInstrumentor().uninstrument()
    CeleryInstrumentor().uninstrument()
    HTTPXClientInstrumentor().uninstrument()
    tracing.ENABLED = tracing._configured = False


def _worker_spans(collector: _Server) -> list:
    spans = []
    for path, body, _ in collector.bodies:
        if path != "/v1/traces":
            continue
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                spans.extend(scope.spans)
    return spans


def test_a_callers_traceparent_is_continued_through_run_steps_and_the_outgoing_call(
    worker_factory, workspace, api, web_tracing
):
    collector, target = _Server(), _Server()
    worker = worker_factory(queues=list(QUEUES), env=live_worker_env(
        OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="100", OTEL_SERVICE_NAME="worker"))  # fmt: skip
    created = api.post(
        "/api/v1/automations", definition(http_step("call", f"{target.url}/hello")), format="json"
    )
    assert created.status_code == 201, created.json()

    fired = api.post(f"/api/v1/automations/{created.json()['id']}/run", {}, format="json",
                     HTTP_TRACEPARENT=TRACEPARENT)  # fmt: skip

    assert fired.status_code == 202, fired.json()
    run_id = fired.json()["run_id"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = Run.objects.filter(pk=run_id, status=RunStatus.SUCCEEDED).exists()
        names = {s.name for s in _worker_spans(collector)}
        if done and {"run", "step call", "GET"} <= names:
            break
        time.sleep(0.1)

    # The web's request span continues the caller's trace
    web = web_tracing.get_finished_spans()
    assert any(s.context.trace_id == int(CALLER_TRACE, 16) and s.kind.name == "SERVER" for s in web), web
    # The worker's spans are in the same trace: the Celery task, the run, its step, the HTTP call
    spans = _worker_spans(collector)
    by_name = {s.name: s for s in spans}
    assert {"run", "step call", "GET"} <= set(by_name), (
        sorted(by_name),
        Run.objects.filter(pk=run_id).values_list("status", "error").first(),
        worker.log_tail(15),
    )
    assert {s.trace_id.hex() for s in spans} == {CALLER_TRACE}
    assert by_name["step call"].parent_span_id == by_name["run"].span_id
    assert by_name["GET"].parent_span_id == by_name["step call"].span_id
    # The outgoing call carried the trace on
    hello = [headers for path, _, headers in target.bodies if path == "/hello"]
    assert hello
    assert {k.lower(): v for k, v in hello[0].items()}["traceparent"].split("-")[1] == CALLER_TRACE
