"""Built-in actions, called the way the engine calls them: ``ACTION.handler(ctx, rendered_config)``."""

from __future__ import annotations

import base64
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from jsonschema import Draft202012Validator

from capabilities import registry
from capabilities.base import ActionContext, Envelope, ErrorCode, Risk, SideEffect, StepFailure
from capabilities.builtin import (
    call_capability,
    emit_event,
    http_request,
    native,
    require_approval,
    send_email,
    transform_data,
    wait,
)

MY_ACTIONS = [
    "transform_data",
    "emit_event",
    "http_request",
    "send_email",
    "wait",
    "call_capability",
    "require_approval",
]


def make_ctx(**overrides: Any) -> ActionContext:
    fields: dict[str, Any] = {
        "run_id": "run-1",
        "step_id": "step-1",
        "attempt": 1,
        "workspace_id": 1,
        "trace_id": "trace-1",
        "idempotency_key": "run-1:step-1",
        "timeout_seconds": 5,
        "egress_allowlist": (),
    }
    return ActionContext(**(fields | overrides))


def schema_errors(action_name: str, config: Any) -> list[str]:
    action = registry.get_action(action_name)
    return [e.message for e in Draft202012Validator(action.config_schema).iter_errors(config)]


# --- a local HTTP server --------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json", **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if url.path == "/echo":
            echo = {
                "method": self.command,
                "query": query,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
            self._send(200, json.dumps(echo).encode(), Set_Cookie="session=abc123")
        elif url.path == "/query":  # every value of every parameter, in order
            self._send(200, json.dumps(parse_qs(url.query)).encode())
        elif url.path == "/text":
            self._send(200, "héllo".encode(), "text/plain; charset=utf-8")
        elif url.path.startswith("/status/"):
            self._send(int(url.path.rsplit("/", 1)[1]), b"internal stack trace with secrets", "text/plain")
        elif url.path == "/slow":
            time.sleep(2)
            self._send(200, b"{}")
        elif url.path == "/drop":
            self.close_connection = True  # the request was read; no response is sent
        elif url.path == "/big":
            self._send(200, b"x" * (2 * 1024 * 1024), "application/octet-stream")
        elif url.path == "/big-json":
            self._send(200, b"[" + b"1," * (1024 * 1024) + b"1]")
        elif url.path == "/redirect":
            self._send(int(query.get("code", "302")), b"", Location=query["to"])
        elif url.path == "/loop":
            self._send(302, b"", Location="/loop")
        else:
            self._send(404, b"{}")

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _dispatch


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients here hang up mid-response on purpose (timeouts, the body cap)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server = _QuietServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _loopback_by_deployment(settings) -> None:
    # The local servers are on loopback: on the deny-list, which only the deployment opens.
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_http(config: dict[str, Any], **ctx_overrides: Any) -> Envelope:
    return http_request.ACTION.handler(make_ctx(**ctx_overrides), config)


# --- registry and schemas ---------------------------------------------------------------


@pytest.mark.parametrize("name", MY_ACTIONS)
def test_action_loads_from_the_registry_with_a_valid_strict_schema(name: str) -> None:
    action = registry.get_action(name)

    assert action is not None
    assert action.name == name
    Draft202012Validator.check_schema(action.config_schema)
    assert action.config_schema["additionalProperties"] is False


def test_native_capabilities_load_from_the_registry() -> None:
    assert registry.get_native_capability("core.echo") is native.ECHO
    assert registry.get_native_capability("core.http_get") is native.HTTP_GET


# --- http_request: describe -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "side_effect", "risk", "idempotent"),
    [
        ("GET", SideEffect.READ, Risk.LOW, True),
        ("HEAD", SideEffect.READ, Risk.LOW, True),
        ("OPTIONS", SideEffect.READ, Risk.LOW, True),
        ("PUT", SideEffect.EXTERNAL_WRITE, Risk.MEDIUM, True),
        ("DELETE", SideEffect.EXTERNAL_WRITE, Risk.MEDIUM, True),  # the policy raises it (test_risk_tokens)
        ("POST", SideEffect.EXTERNAL_WRITE, Risk.MEDIUM, False),
        ("PATCH", SideEffect.EXTERNAL_WRITE, Risk.MEDIUM, False),
        ("{{ inputs.method }}", SideEffect.EXTERNAL_WRITE, Risk.HIGH, False),
    ],
)
def test_http_request_describe_follows_the_method(method, side_effect, risk, idempotent) -> None:
    capability = http_request.describe({"method": method, "url": "https://x", "timeout_seconds": 7})

    assert capability.side_effects == frozenset({side_effect})
    assert (capability.risk, capability.idempotent) == (risk, idempotent)
    assert capability.expected_duration_seconds == 7


@pytest.mark.parametrize(
    "config",
    [
        {"url": "https://x", "json": {}, "body": "b"},
        {"url": "https://x", "timeout_seconds": 121},
        {"url": "https://x", "method": "TRACE"},
        {"url": "ftp://x"},
        {"url": "https://x", "headers": {"a": 1}},
        {"url": "https://x", "unknown": 1},
    ],
)
def test_http_request_schema_rejects_bad_configs(config) -> None:
    assert schema_errors("http_request", config)


# --- http_request: behaviour -------------------------------------------------------------


def test_get_parses_json_and_sends_headers_and_params(base_url: str) -> None:
    envelope = run_http({"url": f"{base_url}/echo", "headers": {"X-Trace": "t1"}, "params": {"q": "a b"}})

    assert envelope.ok
    assert envelope.data["status"] == 200
    assert envelope.data["truncated"] is False
    assert envelope.data["body"]["query"] == {"q": "a b"}
    assert envelope.data["body"]["headers"]["x-trace"] == "t1"
    assert envelope.data["headers"]["content-type"] == "application/json"
    assert envelope.data["headers"]["set-cookie"] == "[redacted]"
    assert envelope.summary == "HTTP 200 from 127.0.0.1"


def test_the_urls_query_string_reaches_the_server_with_params_merged_in(base_url: str) -> None:
    # SPEC §3's own example puts the query in the URL: "/orders?since={{ inputs.since }}"
    alone = run_http({"url": f"{base_url}/query?since=2026-01-01T00:00:00Z&x=1"})
    merged = run_http(
        {"url": f"{base_url}/query?since=2026-01-01T00:00:00Z&x=1", "params": {"q": "a b", "x": "2"}}
    )

    assert alone.data["body"] == {"since": ["2026-01-01T00:00:00Z"], "x": ["1"]}
    assert merged.data["body"] == {"since": ["2026-01-01T00:00:00Z"], "x": ["1", "2"], "q": ["a b"]}


def test_get_sends_no_idempotency_key(base_url: str) -> None:
    envelope = run_http({"url": f"{base_url}/echo"})

    assert "idempotency-key" not in envelope.data["body"]["headers"]


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
def test_non_get_requests_carry_the_idempotency_key(base_url: str, method: str) -> None:
    envelope = run_http({"method": method, "url": f"{base_url}/echo"})

    assert envelope.ok
    if method != "HEAD":
        assert envelope.data["body"]["headers"]["idempotency-key"] == "run-1:step-1"


def test_post_json_body(base_url: str) -> None:
    envelope = run_http({"method": "POST", "url": f"{base_url}/echo", "json": {"a": [1, "é"]}})

    echoed = envelope.data["body"]
    assert echoed["method"] == "POST"
    assert json.loads(echoed["body"]) == {"a": [1, "é"]}
    assert echoed["headers"]["content-type"] == "application/json"


def test_post_raw_body(base_url: str) -> None:
    envelope = run_http(
        {
            "method": "POST",
            "url": f"{base_url}/echo",
            "body": "a=1",
            "headers": {"Content-Type": "text/plain"},
        }
    )

    assert envelope.data["body"]["body"] == "a=1"
    assert envelope.data["body"]["headers"]["content-type"] == "text/plain"


def test_text_body_is_returned_as_text(base_url: str) -> None:
    assert run_http({"url": f"{base_url}/text"}).data["body"] == "héllo"


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (404, ErrorCode.INVALID_ARGUMENT, False),
        (400, ErrorCode.INVALID_ARGUMENT, False),
        (429, ErrorCode.TEMPORARILY_UNAVAILABLE, True),
        (500, ErrorCode.TEMPORARILY_UNAVAILABLE, True),
        (503, ErrorCode.TEMPORARILY_UNAVAILABLE, True),
    ],
)
def test_error_statuses_map_to_stable_codes(base_url: str, status: int, code: str, retryable: bool) -> None:
    envelope = run_http({"url": f"{base_url}/status/{status}"})

    assert not envelope.ok
    assert envelope.error == {
        "code": code,
        "message": f"HTTP {status} from 127.0.0.1",
        "retryable": retryable,
    }
    assert envelope.data["body"] == "internal stack trace with secrets"  # in data, never in the message


@pytest.mark.parametrize(
    ("method", "code", "retryable"),
    [
        ("GET", ErrorCode.TEMPORARILY_UNAVAILABLE, True),
        ("PUT", ErrorCode.TEMPORARILY_UNAVAILABLE, True),
        ("DELETE", ErrorCode.TEMPORARILY_UNAVAILABLE, True),
        ("POST", ErrorCode.OUTCOME_UNKNOWN, False),
        ("PATCH", ErrorCode.OUTCOME_UNKNOWN, False),
    ],
)
def test_read_timeout_depends_on_method_idempotency(base_url: str, method: str, code: str, retryable) -> None:
    started = time.monotonic()

    with pytest.raises(StepFailure) as info:
        run_http({"method": method, "url": f"{base_url}/slow"}, timeout_seconds=0.5)

    assert time.monotonic() - started < 1.5  # ctx.timeout_seconds honoured
    assert (info.value.code, info.value.retryable) == (code, retryable)
    assert "127.0.0.1" in info.value.message


def test_config_timeout_shorter_than_the_step_timeout_wins(base_url: str) -> None:
    with pytest.raises(StepFailure) as info:
        run_http({"url": f"{base_url}/slow", "timeout_seconds": 0.3}, timeout_seconds=30)

    assert info.value.code == ErrorCode.TEMPORARILY_UNAVAILABLE


@pytest.mark.parametrize(
    ("method", "code"), [("GET", ErrorCode.TEMPORARILY_UNAVAILABLE), ("POST", ErrorCode.OUTCOME_UNKNOWN)]
)
def test_connection_dropped_after_the_request_was_sent(base_url: str, method: str, code: str) -> None:
    with pytest.raises(StepFailure) as info:
        run_http({"method": method, "url": f"{base_url}/drop", "json": {"x": 1}})

    assert info.value.code == code


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_connect_failure_is_safe_to_retry_for_any_method(method: str) -> None:
    with pytest.raises(StepFailure) as info:
        run_http({"method": method, "url": f"http://127.0.0.1:{closed_port()}/"})

    assert (info.value.code, info.value.retryable) == (ErrorCode.TEMPORARILY_UNAVAILABLE, True)
    assert info.value.message == "could not connect to 127.0.0.1"
    assert info.value.detail  # raw text kept for logs and audit


def test_response_body_is_capped_at_one_megabyte(base_url: str) -> None:
    envelope = run_http({"url": f"{base_url}/big"})

    assert envelope.ok
    assert envelope.data["truncated"] is True
    assert len(envelope.data["body"]) == http_request.MAX_RESPONSE_BYTES


def test_truncated_json_is_returned_as_text(base_url: str) -> None:
    envelope = run_http({"url": f"{base_url}/big-json"})

    assert envelope.data["truncated"] is True
    assert isinstance(envelope.data["body"], str)


def test_redirect_after_post_303_is_followed_with_get(base_url: str) -> None:
    envelope = run_http(
        {
            "method": "POST",
            "url": f"{base_url}/redirect",
            "params": {"to": "/echo", "code": "303"},
            "json": {"a": 1},
        }
    )

    assert envelope.data["body"]["method"] == "GET"
    assert envelope.data["body"]["body"] == ""


def test_redirect_307_keeps_method_and_body(base_url: str) -> None:
    envelope = run_http(
        {
            "method": "PUT",
            "url": f"{base_url}/redirect",
            "params": {"to": "/echo", "code": "307"},
            "body": "b",
        }
    )

    assert (envelope.data["body"]["method"], envelope.data["body"]["body"]) == ("PUT", "b")


def test_too_many_redirects_is_an_invalid_argument(base_url: str) -> None:
    with pytest.raises(StepFailure) as info:
        run_http({"url": f"{base_url}/loop"})

    assert (info.value.code, info.value.retryable) == (ErrorCode.INVALID_ARGUMENT, False)


def test_cancelled_run_stops_before_sending(base_url: str) -> None:
    with pytest.raises(StepFailure) as info:
        run_http({"url": f"{base_url}/echo"}, cancel_requested=lambda: True)

    assert info.value.code == ErrorCode.CANCELLED


# --- http_request: credentials -------------------------------------------------------------

CREDENTIALS = {
    "api-bearer": {"kind": "bearer", "token": "tok-123"},
    "api-basic": {"kind": "basic", "username": "alice", "password": "pw-456"},
    "api-header": {"kind": "header", "header_name": "X-Api-Key", "value": "key-789"},
    "broken": {"kind": "basic", "username": "alice"},
}


def fake_resolver(name: str, **use) -> dict[str, str] | None:
    return CREDENTIALS.get(name)


@pytest.mark.parametrize(
    ("credential", "header", "value"),
    [
        ("api-bearer", "authorization", "Bearer tok-123"),
        ("api-basic", "authorization", "Basic " + base64.b64encode(b"alice:pw-456").decode()),
        ("api-header", "x-api-key", "key-789"),
    ],
)
def test_credentials_are_applied(base_url: str, credential: str, header: str, value: str) -> None:
    ctx = make_ctx(resolve_credential=fake_resolver)

    envelope = http_request.ACTION.handler(ctx, {"url": f"{base_url}/echo", "credential": credential})

    assert envelope.data["body"]["headers"][header] == value
    assert value.split(" ")[-1] in ctx.secrets  # so the engine redacts the echoed value


@pytest.mark.parametrize("credential", ["missing", "broken"])
def test_unknown_or_unusable_credentials_are_invalid_arguments(base_url: str, credential: str) -> None:
    ctx = make_ctx(resolve_credential=fake_resolver)

    with pytest.raises(StepFailure) as info:
        http_request.ACTION.handler(ctx, {"url": f"{base_url}/echo", "credential": credential})

    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_credentials_and_authorization_do_not_follow_a_redirect_to_another_origin(base_url: str) -> None:
    port = base_url.rsplit(":", 1)[1]
    ctx = make_ctx(resolve_credential=fake_resolver)

    envelope = http_request.ACTION.handler(
        ctx,
        {
            "url": f"{base_url}/redirect",
            "params": {"to": f"http://localhost:{port}/echo"},
            "credential": "api-header",
            "headers": {"Authorization": "Bearer by-hand", "X-Keep": "1"},
        },
    )

    headers = envelope.data["body"]["headers"]
    assert headers["host"] == f"localhost:{port}"
    assert "x-api-key" not in headers
    assert "authorization" not in headers
    assert headers["x-keep"] == "1"


# --- native capabilities ---------------------------------------------------------------------


def test_core_echo_returns_its_args() -> None:
    assert native.ECHO.handler(make_ctx(), {"a": [1]}).data == {"a": [1]}
    assert (native.ECHO.risk, native.ECHO.side_effects, native.ECHO.idempotent) == (
        Risk.LOW,
        frozenset(),
        True,
    )


def test_core_http_get_uses_the_guard(base_url: str, settings) -> None:
    assert native.HTTP_GET.handler(make_ctx(), {"url": f"{base_url}/echo"}).data["status"] == 200
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []
    with pytest.raises(StepFailure) as info:
        native.HTTP_GET.handler(make_ctx(egress_allowlist=("127.0.0.1",)), {"url": f"{base_url}/echo"})
    assert info.value.code == ErrorCode.POLICY_VIOLATION
    assert native.HTTP_GET.side_effects == frozenset({SideEffect.READ})


# --- transform_data ------------------------------------------------------------------------


def test_transform_data_returns_output_as_is() -> None:
    envelope = transform_data.ACTION.handler(make_ctx(), {"output": {"a": 1}})

    assert envelope.ok
    assert envelope.data == {"a": 1}


def test_transform_data_applies_jmespath() -> None:
    config = {
        "output": {"items": [{"id": 1, "ok": True}, {"id": 2, "ok": False}]},
        "jmespath": "items[?ok].id",
    }

    assert transform_data.ACTION.handler(make_ctx(), config).data == [1]


def test_transform_data_invalid_jmespath_fails_validation_and_run() -> None:
    config = {"output": {}, "jmespath": "items[?"}

    assert [code for _, code, _ in transform_data.validate(config)] == ["invalid_jmespath"]
    with pytest.raises(StepFailure) as info:
        transform_data.ACTION.handler(make_ctx(), config)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_transform_data_jmespath_type_error_is_invalid_argument() -> None:
    with pytest.raises(StepFailure) as info:
        transform_data.ACTION.handler(make_ctx(), {"output": {"a": 1}, "jmespath": "length(a)"})

    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_transform_data_templated_jmespath_is_checked_only_once_rendered() -> None:
    assert transform_data.validate({"output": {}, "jmespath": "{{ inputs.path }}"}) == []
    assert transform_data.validate({"output": {}, "jmespath": "a.b"}) == []


def test_transform_data_is_pure() -> None:
    capability = transform_data.describe({"output": 1})

    assert (capability.side_effects, capability.risk, capability.idempotent) == (frozenset(), Risk.LOW, True)
    assert capability.expected_duration_seconds == 0.01


# --- emit_event -------------------------------------------------------------------------------


def test_emit_event_publishes_and_returns_the_event_id() -> None:
    published = []

    def publish(event_type, payload):
        published.append((event_type, payload))
        return "evt-1"

    envelope = emit_event.ACTION.handler(
        make_ctx(publish_event=publish), {"event_type": "order.created", "payload": {"id": 7}}
    )

    assert envelope.data == {"event_id": "evt-1"}
    assert published == [("order.created", {"id": 7})]


def test_emit_event_profile_and_schema() -> None:
    capability = emit_event.describe({})

    assert capability.side_effects == frozenset({SideEffect.WRITE})
    assert (capability.risk, capability.idempotent) == (Risk.LOW, False)
    assert schema_errors("emit_event", {"event_type": "Bad Type!", "payload": {}})
    assert not schema_errors("emit_event", {"event_type": "a.b-c_1", "payload": {}})


# --- wait -------------------------------------------------------------------------------------


def test_wait_seconds_returns_resume_at_without_sleeping() -> None:
    started = time.monotonic()

    envelope = wait.ACTION.handler(make_ctx(), {"seconds": 3600})

    assert time.monotonic() - started < 0.5
    assert envelope.ok
    expected = datetime.now(UTC) + timedelta(hours=1)
    assert abs((envelope.resume_at - expected).total_seconds()) < 5


def test_wait_until_returns_that_time() -> None:
    envelope = wait.ACTION.handler(make_ctx(), {"until": "2099-01-31T09:00:00+02:00"})

    assert envelope.resume_at == datetime(2099, 1, 31, 7, 0, tzinfo=UTC)
    assert envelope.data == {"resume_at": "2099-01-31T07:00:00+00:00"}


def test_wait_until_in_the_past_resumes_now() -> None:
    envelope = wait.ACTION.handler(make_ctx(), {"until": "2001-01-01T00:00:00Z"})

    assert abs((envelope.resume_at - datetime.now(UTC)).total_seconds()) < 5


def test_wait_requires_exactly_one_of_seconds_or_until() -> None:
    assert schema_errors("wait", {"seconds": 1, "until": "2099-01-01T00:00:00Z"})
    assert schema_errors("wait", {})
    assert schema_errors("wait", {"seconds": 31 * 24 * 3600})
    assert not schema_errors("wait", {"seconds": 0})


def test_wait_until_must_be_an_aware_datetime() -> None:
    assert [code for _, code, _ in wait.validate({"until": "2099-01-01T00:00:00"})] == ["invalid_datetime"]
    assert [code for _, code, _ in wait.validate({"until": "next tuesday"})] == ["invalid_datetime"]
    with pytest.raises(StepFailure) as info:
        wait.ACTION.handler(make_ctx(), {"until": "2099-01-01T00:00:00"})
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


# --- call_capability / require_approval -------------------------------------------------------


def test_call_capability_delegates_to_the_context() -> None:
    calls = []

    def call(capability_id, args):
        calls.append((capability_id, args))
        return Envelope.success({"done": True})

    envelope = call_capability.ACTION.handler(
        make_ctx(call_capability=call), {"capability": "github.create_issue", "args": {"title": "t"}}
    )

    assert envelope.data == {"done": True}
    assert calls == [("github.create_issue", {"title": "t"})]


def test_call_capability_describes_a_native_target_and_assumes_the_worst_otherwise() -> None:
    assert call_capability.describe({"capability": "core.echo"}) is native.ECHO
    unknown = call_capability.describe({"capability": "github.create_issue"})
    assert (unknown.risk, unknown.idempotent) == (Risk.HIGH, False)


def test_require_approval_returns_its_message() -> None:
    envelope = require_approval.ACTION.handler(make_ctx(), {"message": "Ship it?", "approvals_required": 2})

    assert envelope.data == {"message": "Ship it?"}
    assert require_approval.describe({}).side_effects == frozenset()
    assert schema_errors("require_approval", {"message": "x", "approvals_required": 6})
    assert schema_errors("require_approval", {"message": "x" * 2001})


# --- send_email ---------------------------------------------------------------------------------


def test_send_email_sends_through_django(mailoutbox, settings) -> None:
    settings.DEFAULT_FROM_EMAIL = "autoplane@example.net"
    config = {
        "to": ["a@example.com"],
        "cc": ["b@example.com"],
        "subject": "Hello",
        "body": "plain",
        "html_body": "<p>html</p>",
    }

    envelope = send_email.ACTION.handler(make_ctx(), config)

    assert envelope.ok
    assert envelope.data == {"recipients": 2}
    [message] = mailoutbox
    assert (message.to, message.cc, message.subject, message.body) == (
        ["a@example.com"],
        ["b@example.com"],
        "Hello",
        "plain",
    )
    assert message.alternatives[0][0] == "<p>html</p>"
    assert message.from_email == "autoplane@example.net"
    assert message.extra_headers["Message-ID"].endswith(".autoplane@example.net>")


def test_send_email_message_id_is_stable_per_step(mailoutbox, settings) -> None:
    settings.AUTOPLANE_EMAIL_ALLOWED_FROM = ["ops@example.org"]
    config = {"to": ["a@example.com"], "subject": "s", "body": "b", "from": "ops@example.org"}

    send_email.ACTION.handler(make_ctx(), config)
    send_email.ACTION.handler(make_ctx(attempt=2), config)

    first, second = mailoutbox
    assert first.extra_headers["Message-ID"] == second.extra_headers["Message-ID"]
    assert first.from_email == "ops@example.org"


def test_send_email_describes_a_write_and_leaves_many_recipients_to_the_policy() -> None:
    few = send_email.describe({"to": ["a@x.io"] * 10})
    many = send_email.describe({"to": ["a@x.io"] * 8, "cc": ["b@x.io"] * 3})

    assert few.side_effects == frozenset({SideEffect.EXTERNAL_WRITE, SideEffect.USER_VISIBLE})
    assert (few.risk, few.idempotent) == (Risk.MEDIUM, False)
    assert many.risk == Risk.MEDIUM  # raised once, by approvals.policy (tests/approvals/test_risk_tokens.py)
    templated = send_email.describe({"to": "{{ inputs.to }}"})
    assert templated.risk == Risk.HIGH
    assert "unknown number of recipients" in templated.description


@pytest.mark.parametrize(
    "config",
    [
        {"to": [], "subject": "s", "body": "b"},
        {"to": ["a@x.io"] * 51, "subject": "s", "body": "b"},
        {"to": ["not-an-address"], "subject": "s", "body": "b"},
        {"to": ["a@x.io\r\nBcc: evil@x.io"], "subject": "s", "body": "b"},
        {"to": ["a@x.io"], "subject": "s\r\nBcc: evil@x.io", "body": "b"},
    ],
)
def test_send_email_schema_rejects_bad_configs(config) -> None:
    assert schema_errors("send_email", config)


class _FakeSmtp(socketserver.StreamRequestHandler):
    """Just enough SMTP: ``server.mode`` picks where it misbehaves."""

    def handle(self) -> None:
        reply = self.wfile.write
        reply(b"220 fake\r\n")
        while line := self.rfile.readline():
            command = line.strip().upper()
            if command.startswith(b"RCPT") and self.server.mode == "refuse_rcpt":
                reply(b"550 no such user\r\n")
            elif command == b"DATA":
                reply(b"354 go ahead\r\n")
                while self.rfile.readline() not in (b".\r\n", b""):
                    pass
                if self.server.mode == "drop_after_data":
                    return
                reply(b"250 queued\r\n")
            elif command == b"QUIT":
                reply(b"221 bye\r\n")
                return
            else:
                reply(b"250 ok\r\n")


@pytest.fixture
def smtp_server(settings) -> Iterator[socketserver.ThreadingTCPServer]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _FakeSmtp)
    server.daemon_threads = True
    server.mode = "ok"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = server.server_address
    settings.EMAIL_USE_TLS = settings.EMAIL_USE_SSL = False
    yield server
    server.shutdown()
    server.server_close()


EMAIL = {"to": ["a@example.com"], "subject": "s", "body": "b"}


def test_send_email_over_smtp(smtp_server) -> None:
    assert send_email.ACTION.handler(make_ctx(), EMAIL).ok


def test_smtp_server_unreachable_is_temporarily_unavailable(settings) -> None:
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", closed_port()

    with pytest.raises(StepFailure) as info:
        send_email.ACTION.handler(make_ctx(), EMAIL)

    assert (info.value.code, info.value.retryable) == (ErrorCode.TEMPORARILY_UNAVAILABLE, True)


def test_smtp_recipients_refused_is_invalid_argument(smtp_server) -> None:
    smtp_server.mode = "refuse_rcpt"

    with pytest.raises(StepFailure) as info:
        send_email.ACTION.handler(make_ctx(), EMAIL)

    assert (info.value.code, info.value.retryable) == (ErrorCode.INVALID_ARGUMENT, False)


def test_smtp_connection_lost_after_data_is_outcome_unknown(smtp_server) -> None:
    smtp_server.mode = "drop_after_data"

    with pytest.raises(StepFailure) as info:
        send_email.ACTION.handler(make_ctx(), EMAIL)

    assert (info.value.code, info.value.retryable) == (ErrorCode.OUTCOME_UNKNOWN, False)
