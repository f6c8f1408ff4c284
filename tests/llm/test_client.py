"""The provider interface against a real HTTP server on 127.0.0.1: answers, retries,
error mapping, the response-size cap and prices."""

from __future__ import annotations

import socket
from decimal import Decimal

import pytest

from capabilities import llm as llm_api
from tests.llm_server import Reply, reply_text, reply_tool_call

pytestmark = pytest.mark.django_db


def test_a_completion_carries_text_usage_and_the_configured_model_and_key(llm):
    llm.script(reply_text("hello", prompt_tokens=7, completion_tokens=3))

    answer = llm_api.require_llm().chat([{"role": "user", "content": "hi"}], max_tokens=50)

    assert (answer.content, answer.usage.as_dict()) == ("hello", {"prompt_tokens": 7, "completion_tokens": 3})
    assert llm.requests[0]["model"] == "scripted-model"
    assert llm.requests[0]["max_tokens"] == 50
    assert llm.headers[0]["authorization"] == "Bearer sk-test-llm-key"


def test_tool_calls_are_parsed_and_replayable_as_an_assistant_message(llm):
    llm.script(reply_tool_call("core.echo", {"x": 1}, call_id="c9"))

    answer = llm_api.require_llm().chat([{"role": "user", "content": "go"}])

    assert [(c.id, c.name, c.arguments) for c in answer.tool_calls] == [("c9", "core.echo", '{"x": 1}')]
    assert answer.assistant_message()["tool_calls"][0]["function"]["name"] == "core.echo"


def test_429_and_5xx_are_retried_with_backoff_then_answered(llm):
    llm.script(
        Reply(429, {"error": "slow"}, {"Retry-After": "0"}), Reply(502, {"error": "bad gw"}), reply_text("ok")
    )

    answer = llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert answer.content == "ok"
    assert len(llm.requests) == 3


def test_persistent_5xx_is_temporarily_unavailable_after_the_retries(llm, settings):
    settings.LLM_MAX_RETRIES = 2
    llm.script(*[Reply(503, {"error": "down"})] * 3)

    with pytest.raises(llm_api.LlmError) as caught:
        llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert (caught.value.code, caught.value.retryable, caught.value.http_status) == (
        "TEMPORARILY_UNAVAILABLE",
        True,
        503,
    )
    assert "down" not in caught.value.message  # provider text stays in detail
    assert len(llm.requests) == 3


def test_a_refused_request_is_invalid_argument_and_not_retried(llm):
    llm.script(Reply(400, {"error": {"message": "context length exceeded"}}))

    with pytest.raises(llm_api.LlmError) as caught:
        llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert (caught.value.code, caught.value.retryable) == ("INVALID_ARGUMENT", False)
    assert len(llm.requests) == 1


@pytest.mark.parametrize(
    "body",
    [b"<html>not json</html>", b'{"choices": []}', b'{"choices": [{"message": {"content": 5}}]}'],
    ids=["not-json", "no-choices", "content-not-text"],
)
def test_an_answer_that_is_not_a_chat_completion_is_invalid_argument(llm, body):
    llm.script(Reply(200, body))

    with pytest.raises(llm_api.LlmError) as caught:
        llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert caught.value.code == "INVALID_ARGUMENT"


def test_a_1mb_answer_is_refused_at_the_size_cap(llm):
    llm.script(reply_text("x" * (1024 * 1024)))

    with pytest.raises(llm_api.LlmError) as caught:
        llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert caught.value.code == "INVALID_ARGUMENT"
    assert "larger than" in caught.value.message


def test_an_unreachable_server_is_temporarily_unavailable(settings, llm):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.LLM_BASE_URL = f"http://127.0.0.1:{port}/v1"
    settings.LLM_MAX_RETRIES = 1

    with pytest.raises(llm_api.LlmError) as caught:
        llm_api.require_llm().chat([{"role": "user", "content": "hi"}])

    assert caught.value.code == "TEMPORARILY_UNAVAILABLE"


def test_without_base_url_and_model_the_llm_is_not_configured(no_llm):
    with pytest.raises(llm_api.LlmNotConfigured) as caught:
        llm_api.require_llm()

    assert (caught.value.code, caught.value.http_status) == ("LLM_NOT_CONFIGURED", 503)


def test_cost_follows_the_per_model_price_and_the_wildcard(settings):
    settings.LLM_PRICES = {"big": (Decimal("3"), Decimal("15")), "*": (Decimal("1"), Decimal("1"))}

    assert llm_api.cost_usd("big", llm_api.Usage(1_000_000, 100_000)) == Decimal("4.5")
    assert llm_api.cost_usd("other", llm_api.Usage(500_000, 500_000)) == Decimal("1")
    settings.LLM_PRICES = {}
    assert llm_api.cost_usd("big", llm_api.Usage(10**6, 10**6)) == 0
