"""The webhook fire endpoint (SPEC §6.2): hostile requests get the documented status and
leave no run behind; good ones start exactly one run."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
import redis
from django.conf import settings
from django.db import OperationalError, connection
from rest_framework.test import APIClient

from audit.models import AuditEvent
from automations.models import Run
from tests.factories import definition, fire, webhook
from triggers import webhooks
from triggers.models import Trigger, WebhookRateWindow
from triggers.services import trigger_signing_secret_rotate, trigger_token_revoke, trigger_token_rotate

UNAUTHORIZED = b'{"error":{"code":"UNAUTHENTICATED","message":"invalid or missing token"}}'


def _rejections() -> list[AuditEvent]:
    return list(AuditEvent.objects.filter(type="webhook.rejected").order_by("id"))


def _assert_rejected(response, status: int, *, token: str | None = None, code: str | None = None):
    """The status, no run, and one more ``webhook.rejected`` audit event that does not hold the token."""
    assert response.status_code == status, response.content
    assert Run.objects.count() == 0
    events = _rejections()
    assert events, "every rejection is audited"
    assert events[-1].payload["status"] == status
    if token:
        for event in AuditEvent.objects.all():
            assert token not in json.dumps([event.summary, event.refs, event.payload])
    if code:
        assert response.json()["error"]["code"] == code
    return events[-1]


# --- the same 401 for every authentication failure ---------------------------------------


def test_every_authentication_failure_answers_the_same_401(db, hook, make_automation, owner, api, settings):
    settings.AUTOPLANE_WEBHOOK_REJECTIONS_AUDITED = 100  # each of them gets its own ledger row
    automation, trigger, token = hook()
    other, other_trigger, other_token = hook(name="other")
    disabled = make_automation(definition(name="disabled", triggers=[{**webhook(), "enabled": False}]))
    disabled_token = trigger_token_rotate(trigger=Trigger.objects.get(automation=disabled), user=owner)
    revoked, revoked_trigger, revoked_token = hook(name="revoked")
    trigger_token_revoke(trigger=revoked_trigger, user=owner)
    paused, paused_trigger, paused_token = hook(name="paused")
    from automations import services

    services.automation_update(automation=paused, status="paused", user=owner)
    session_client = APIClient()
    session_client.force_login(owner)
    anonymous = APIClient()
    api_token = api._credentials["HTTP_AUTHORIZATION"]

    cases = {
        "no Authorization header": fire(anonymous, automation.pk),
        "garbage token": fire(anonymous, automation.pk, token="apt_not-a-real-token"),
        "empty bearer": fire(anonymous, automation.pk, HTTP_AUTHORIZATION="Bearer "),
        "basic scheme": fire(anonymous, automation.pk, HTTP_AUTHORIZATION=f"Basic {token}"),
        "token without a scheme": fire(anonymous, automation.pk, HTTP_AUTHORIZATION=token),
        "token in the query string": fire(anonymous, automation.pk, path_suffix=f"?token={token}"),
        "access_token in the query string": fire(
            anonymous, automation.pk, path_suffix=f"?access_token={token}"
        ),
        "token in the body": fire(
            anonymous, automation.pk, {"token": token, "authorization": f"Bearer {token}"}
        ),
        "token in a cookie": fire(APIClient(HTTP_COOKIE=f"token={token}"), automation.pk),
        "session cookie only": fire(session_client, automation.pk),
        "API token (Token scheme)": fire(anonymous, automation.pk, HTTP_AUTHORIZATION=api_token),
        "another automation's token": fire(anonymous, automation.pk, token=other_token),
        "unknown automation": fire(anonymous, uuid.uuid4(), token=token),
        "not an automation id": fire(anonymous, "not-a-uuid", token=token),
        "disabled trigger": fire(anonymous, disabled.pk, token=disabled_token),
        "revoked token": fire(anonymous, revoked.pk, token=revoked_token),
        "paused automation": fire(anonymous, paused.pk, token=paused_token),
    }

    first = cases["no Authorization header"]
    for name, response in cases.items():
        assert response.status_code == 401, name
        assert response.content == UNAUTHORIZED, name
        assert response["WWW-Authenticate"] == "Bearer", name
        assert dict(response.headers) == dict(first.headers), name
    assert Run.objects.count() == 0
    reasons = [event.payload["reason"] for event in _rejections()]
    assert len(reasons) == len(cases)
    # (pausing an automation disables its triggers, so that case reads "trigger disabled")
    assert {"unknown token", "token of another automation", "revoked token", "trigger disabled",
            "missing or malformed Authorization header"} <= set(reasons)  # fmt: skip
    for event in AuditEvent.objects.all():
        for secret in (token, other_token, disabled_token, revoked_token, paused_token):
            assert secret not in json.dumps([event.summary, event.refs, event.payload])


def test_a_rotated_token_replaces_the_old_one(db, hook, owner):
    automation, trigger, old = hook()
    new = trigger_token_rotate(trigger=trigger, user=owner)

    assert fire(APIClient(), automation.pk, token=old).content == UNAUTHORIZED
    assert fire(APIClient(), automation.pk, token=new).status_code == 202
    stored = Trigger.objects.get(pk=trigger.pk)
    assert stored.token_hash not in (old, new)
    assert len(stored.token_hash) == 64


def test_rejection_of_an_unknown_automation_is_audited_on_the_platform_chain(db, hook):
    _, _, token = hook()

    response = fire(APIClient(), uuid.uuid4(), token=token)

    event = _assert_rejected(response, 401, token=token)
    assert event.chain == "platform"


# --- transport: media type, size ---------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/json; charset=latin-1", ""],
)
def test_a_body_that_is_not_declared_json_is_415(db, hook, content_type):
    automation, _, token = hook()

    response = fire(APIClient(), automation.pk, b'{"a": 1}', token=token, content_type=content_type)

    _assert_rejected(response, 415, token=token, code="UNSUPPORTED_MEDIA_TYPE")


def test_json_with_a_utf8_charset_is_accepted(db, hook):
    automation, _, token = hook()

    response = fire(
        APIClient(), automation.pk, b'{"a": 1}', token=token, content_type="Application/JSON; charset=UTF-8"
    )

    assert response.status_code == 202


def test_a_body_over_256_kb_is_413(db, hook):
    automation, _, token = hook()
    body = json.dumps({"blob": "x" * (256 * 1024)}).encode()

    response = fire(APIClient(), automation.pk, body, token=token)

    _assert_rejected(response, 413, token=token, code="PAYLOAD_TOO_LARGE")


def test_a_body_longer_than_its_content_length_claims_is_still_cut_at_256_kb(db, hook):
    automation, trigger, token = hook()
    body = json.dumps({"blob": "x" * (256 * 1024)}).encode()
    request = webhooks.FireRequest(
        automation_id=str(automation.pk), headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        content_length="10", read_body=lambda n: body[:n],
    )  # fmt: skip

    with pytest.raises(webhooks.WebhookRejected) as rejected:
        webhooks.webhook_fire(request)

    assert rejected.value.http_status == 413
    assert Run.objects.count() == 0


def test_a_body_of_exactly_256_kb_is_accepted(db, hook):
    automation, _, token = hook()
    padding = 256 * 1024 - len(json.dumps({"blob": ""}))
    body = json.dumps({"blob": "x" * padding}).encode()
    assert len(body) == 256 * 1024

    assert fire(APIClient(), automation.pk, body, token=token).status_code == 202


# --- hostile JSON ----------------------------------------------------------------------------------------

HOSTILE_BODIES = {
    "empty": b"",
    "malformed": b'{"a": ',
    "trailing garbage": b'{"a": 1} x',
    "not an object (list)": b"[1, 2]",
    "not an object (string)": b'"hello"',
    "not an object (null)": b"null",
    "NaN": b'{"a": NaN}',
    "Infinity": b'{"a": Infinity}',
    "-Infinity": b'{"a": -Infinity}',
    "float overflow": b'{"a": 1e400}',
    "integer past 2^63": b'{"a": 9223372036854775808}',
    "integer below -2^63": b'{"a": -9223372036854775809}',
    "5000-digit integer": b'{"a": ' + b"9" * 5000 + b"}",
    "nested 65 deep": b'{"a": ' + b"[" * 64 + b"]" * 64 + b"}",
    "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,
    "object nesting 40,000 deep": b'{"a":' * 40_000 + b"1" + b"}" * 40_000,
    "NUL in a string": b'{"a": "x\\u0000y"}',
    "NUL in a key": b'{"a\\u0000": 1}',
    "lone surrogate": b'{"a": "\\ud800"}',
    "invalid UTF-8": b'{"a": "\xff\xfe"}',
    "non-string idempotency_key": b'{"idempotency_key": 5}',
    "idempotency_key too long": json.dumps({"idempotency_key": "k" * 256}).encode(),
}


@pytest.mark.parametrize("name", list(HOSTILE_BODIES))
def test_hostile_json_is_400_and_starts_nothing(db, hook, name):
    automation, _, token = hook()

    response = fire(APIClient(), automation.pk, HOSTILE_BODIES[name], token=token)

    _assert_rejected(response, 400, token=token, code="INVALID_ARGUMENT")
    assert "Traceback" not in response.content.decode()


def test_nesting_of_64_levels_is_accepted(db, hook):
    automation, _, token = hook()
    body = b'{"a": ' + b"[" * 63 + b"]" * 63 + b"}"

    assert fire(APIClient(), automation.pk, body, token=token).status_code == 202


def test_an_idempotency_key_header_over_255_characters_is_400(db, hook):
    automation, _, token = hook()

    response = fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="k" * 256)

    _assert_rejected(response, 400, token=token)


# --- success, inputs and idempotency ------------------------------------------------------------------


def test_a_fire_starts_a_run_with_the_body_as_inputs_and_trigger_payload(db, hook, drive):
    automation, trigger, token = hook()

    response = fire(APIClient(), automation.pk, {"ref": "main", "n": 1}, token=token)

    assert response.status_code == 202
    body = response.json()
    assert body["status_url"] == f"/api/v1/runs/{body['run_id']}"
    run = Run.objects.get(pk=body["run_id"])
    assert (run.trigger_type, run.trigger_key, run.trigger_id) == ("webhook", "hook", trigger.pk)
    assert run.inputs == {"ref": "main", "n": 1}
    assert run.trigger_payload == {"ref": "main", "n": 1}
    assert drive(run.pk).status == "succeeded"
    assert Trigger.objects.get(pk=trigger.pk).last_fired_at is not None


def test_input_mapping_picks_inputs_out_of_the_body(db, make_automation, owner, drive):
    automation = make_automation(
        definition(
            triggers=[webhook(input_mapping={"branch": "$.ref", "ids": "$.items[*].id", "sha": "$.head.sha",
                                             "absent": "$.nope"})],  # fmt: skip
            inputs={"schema": {"type": "object", "required": ["branch"],
                               "properties": {"branch": {"type": "string"}, "absent": {"default": "fallback"}}}},
            plan=[{"step_id": "say", "action": "transform_data",
                   "config": {"output": "{{ inputs.branch }}:{{ inputs.ids | join(',') }}:{{ trigger.head.sha }}"}}],
        )
    )  # fmt: skip
    token = trigger_token_rotate(trigger=automation.triggers.get(), user=owner)
    body = {"ref": "main", "items": [{"id": 1}, {"id": 2}], "head": {"sha": "abc"}, "extra": True}

    response = fire(APIClient(), automation.pk, body, token=token)

    assert response.status_code == 202, response.content
    run = Run.objects.get(pk=response.json()["run_id"])
    assert run.inputs == {"branch": "main", "ids": [1, 2], "sha": "abc", "absent": "fallback"}
    assert run.trigger_payload == body
    assert drive(run.pk).output == "main:1,2:abc"


def test_a_mapped_input_the_schema_refuses_is_400_with_errors(db, make_automation, owner):
    automation = make_automation(
        definition(
            triggers=[webhook(input_mapping={"branch": "$.ref"})],
            inputs={"schema": {"type": "object", "required": ["branch"]}},
        )  # fmt: skip
    )
    token = trigger_token_rotate(trigger=automation.triggers.get(), user=owner)

    response = fire(APIClient(), automation.pk, {"other": 1}, token=token)

    _assert_rejected(response, 400, token=token)
    assert response.json()["errors"][0]["code"] == "invalid_input"


def test_same_idempotency_key_and_body_answer_the_original_run(db, hook):
    automation, _, token = hook()

    first = fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="k-1")
    again = fire(APIClient(), automation.pk, b'{ "a" : 1 }', token=token, HTTP_IDEMPOTENCY_KEY="k-1")

    assert (first.status_code, again.status_code) == (202, 200)
    assert first.json()["run_id"] == again.json()["run_id"]
    assert Run.objects.count() == 1


def test_an_idempotency_key_reused_with_another_body_is_422(db, hook):
    automation, _, token = hook()
    assert (
        fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="k-1").status_code == 202
    )

    response = fire(APIClient(), automation.pk, {"a": 2}, token=token, HTTP_IDEMPOTENCY_KEY="k-1")

    assert response.status_code == 422
    assert response.json()["error"]["code"] == "UNPROCESSABLE"
    assert Run.objects.count() == 1
    assert _rejections()[-1].payload["status"] == 422


def test_an_idempotency_key_in_the_body_dedupes_and_is_not_an_input(db, hook):
    automation, _, token = hook()

    first = fire(APIClient(), automation.pk, {"idempotency_key": "b-1", "a": 1}, token=token)
    again = fire(APIClient(), automation.pk, {"idempotency_key": "b-1", "a": 1}, token=token)

    assert (first.status_code, again.status_code) == (202, 200)
    assert Run.objects.get().inputs == {"a": 1}


def test_idempotency_keys_are_scoped_to_the_trigger(db, hook):
    first_automation, _, first_token = hook()
    second_automation, _, second_token = hook(name="second")

    a = fire(APIClient(), first_automation.pk, {"a": 1}, token=first_token, HTTP_IDEMPOTENCY_KEY="same")
    b = fire(APIClient(), second_automation.pk, {"a": 2}, token=second_token, HTTP_IDEMPOTENCY_KEY="same")

    assert (a.status_code, b.status_code) == (202, 202)
    assert Run.objects.count() == 2


def test_a_dropped_fire_answers_suppressed(db, make_automation, owner):
    automation = make_automation(
        definition(triggers=[webhook()], execution={"concurrency": "drop_if_running"})
    )
    token = trigger_token_rotate(trigger=automation.triggers.get(), user=owner)
    assert fire(APIClient(), automation.pk, {}, token=token).status_code == 202

    response = fire(APIClient(), automation.pk, {}, token=token)

    assert response.status_code == 200
    assert response.json()["run_id"] is None
    assert response.json()["suppressed"] is True


def test_last_fired_at_is_passed_to_the_next_fire(db, make_automation, owner):
    automation = make_automation(
        definition(triggers=[webhook()],
                   inputs={"schema": {"type": "object", "properties": {"since": {"default": "$last_fired_at"}}}})
    )  # fmt: skip
    token = trigger_token_rotate(trigger=automation.triggers.get(), user=owner)
    first = Run.objects.get(pk=fire(APIClient(), automation.pk, {}, token=token).json()["run_id"])
    fired_at = Trigger.objects.get(automation=automation).last_fired_at

    second = Run.objects.get(pk=fire(APIClient(), automation.pk, {}, token=token).json()["run_id"])

    assert first.inputs["since"] == automation.triggers.get().created_at.isoformat()
    assert second.inputs["since"] == fired_at.isoformat()


# --- signatures -----------------------------------------------------------------------------------------


@pytest.fixture
def signed(hook, owner):
    automation, trigger, token = hook(require_signature=True)
    secret = trigger_signing_secret_rotate(trigger=trigger, user=owner)
    return automation, trigger, token, secret


def _signature_headers(
    secret: str, body: bytes, *, msg_id: str = "msg_1", timestamp: int | None = None
) -> dict:
    timestamp = int(time.time()) if timestamp is None else timestamp
    return {
        "HTTP_WEBHOOK_ID": msg_id,
        "HTTP_WEBHOOK_TIMESTAMP": str(timestamp),
        "HTTP_WEBHOOK_SIGNATURE": f"v1,bm90LXRoaXMtb25l {webhooks.sign(secret, msg_id, timestamp, body)}",
    }


def test_a_correctly_signed_fire_is_accepted_and_its_webhook_id_dedupes(db, signed):
    automation, _, token, secret = signed
    body = b'{"a": 1}'
    headers = _signature_headers(secret, body)

    first = fire(APIClient(), automation.pk, body, token=token, **headers)
    replay = fire(APIClient(), automation.pk, body, token=token, **headers)

    assert (first.status_code, replay.status_code) == (202, 200)
    assert Run.objects.count() == 1


def test_a_bad_signature_is_401_invalid_signature(db, signed):
    automation, _, token, secret = signed
    headers = _signature_headers(secret, b'{"a": 1}')

    response = fire(APIClient(), automation.pk, b'{"a": 2}', token=token, **headers)

    event = _assert_rejected(response, 401, token=token, code="INVALID_SIGNATURE")
    assert secret not in json.dumps(event.payload)


def test_a_signature_from_another_secret_is_refused(db, signed):
    automation, _, token, _ = signed
    body = b'{"a": 1}'

    response = fire(APIClient(), automation.pk, body, token=token,
                    **_signature_headers("whsec_" + "A" * 44, body))  # fmt: skip

    _assert_rejected(response, 401, token=token, code="INVALID_SIGNATURE")


@pytest.mark.parametrize("skew", [-301, 301, -3600])
def test_a_stale_or_future_timestamp_is_refused(db, signed, skew):
    automation, _, token, secret = signed
    body = b'{"a": 1}'

    response = fire(APIClient(), automation.pk, body, token=token,
                    **_signature_headers(secret, body, timestamp=int(time.time()) + skew))  # fmt: skip

    _assert_rejected(response, 401, token=token, code="INVALID_SIGNATURE")


def test_missing_signature_headers_are_refused(db, signed):
    automation, _, token, _ = signed

    response = fire(APIClient(), automation.pk, b'{"a": 1}', token=token)

    _assert_rejected(response, 401, token=token, code="INVALID_SIGNATURE")


# --- rate limit ---------------------------------------------------------------------------------------------


def test_the_rate_limit_counts_per_trigger_in_one_minute_windows(db, hook):
    _, trigger, _ = hook()
    _, other, _ = hook(name="other")
    now = 1_800_000_020.0  # 20 s into a window

    hits = [webhooks.rate_limit_hit(trigger, 3, now + i) for i in range(4)]

    assert hits == [None, None, None, 37]
    assert webhooks.rate_limit_hit(other, 3, now) is None
    assert webhooks.rate_limit_hit(trigger, 3, now + 40) is None  # the next window


@pytest.mark.skipif(not settings.AUTOPLANE_RATE_LIMIT_REDIS_URL, reason="the Redis lane counts in Redis")
def test_on_the_redis_lane_the_rate_limit_counts_in_redis_not_the_database(db, hook):
    _, trigger, _ = hook()
    now = 1_800_000_080.0  # 20 s into a window

    hits = [webhooks.rate_limit_hit(trigger, 2, now + i) for i in range(3)]

    assert hits == [None, None, 38]
    assert not WebhookRateWindow.objects.exists()
    key = f"autoplane:webhook-rate:{trigger.pk}:{int(now // 60)}"
    client = redis.Redis.from_url(settings.AUTOPLANE_RATE_LIMIT_REDIS_URL)
    assert int(client.get(key)) == 3
    assert 0 < client.ttl(key) <= 120  # nothing to clean up: the window expires


def test_a_rate_limit_redis_that_does_not_answer_falls_back_to_the_database(db, hook, settings, caplog):
    _, trigger, _ = hook()
    settings.AUTOPLANE_RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    now = 1_800_000_140.0

    hits = [webhooks.rate_limit_hit(trigger, 1, now + i) for i in range(2)]

    assert hits == [None, 39]
    assert WebhookRateWindow.objects.get(trigger=trigger).hits == 2
    assert "counting in the database" in caplog.text


def test_a_rate_limit_redis_client_failing_outside_its_own_errors_falls_back_to_the_database(
    db, hook, settings, monkeypatch, caplog
):
    # redis-py has been seen to end a handshake timeout in ValueError ("I/O operation on closed
    # file"), not a RedisError: the fire must still be counted, in the database, not answered 500.
    pytest.importorskip("redis")
    from config import redis_direct

    discarded: list[str] = []

    def broken(url, timeout):
        raise ValueError("I/O operation on closed file.")

    _, trigger, _ = hook()
    settings.AUTOPLANE_RATE_LIMIT_REDIS_URL = "redis://127.0.0.1:6379/14"
    monkeypatch.setattr(redis_direct, "connection", broken)
    monkeypatch.setattr(redis_direct, "discard", lambda url, timeout: discarded.append(url))
    now = 1_800_000_200.0

    hits = [webhooks.rate_limit_hit(trigger, 1, now + i) for i in range(2)]

    assert hits == [None, 39]
    assert WebhookRateWindow.objects.get(trigger=trigger).hits == 2
    assert discarded == ["redis://127.0.0.1:6379/14"] * 2  # a fresh connection next time
    assert "Redis client failed" in caplog.text


def test_fires_past_the_rate_limit_are_429_with_retry_after(db, hook, monkeypatch):
    automation, _, token = hook(rate_limit_per_minute=3)
    clock = datetime(2027, 1, 15, 10, 0, 15, tzinfo=UTC)
    monkeypatch.setattr(webhooks, "timezone", SimpleNamespace(now=lambda: clock))

    statuses = [fire(APIClient(), automation.pk, {}, token=token).status_code for _ in range(3)]
    response = fire(APIClient(), automation.pk, {}, token=token)

    assert statuses == [202, 202, 202]
    assert response.status_code == 429
    assert response["Retry-After"] == "45"
    assert response.json()["error"]["code"] == "RATE_LIMITED"
    assert Run.objects.count() == 3
    assert _rejections()[-1].payload["status"] == 429


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        (b"<xml/>", {"content_type": "text/xml"}),  # 415
        (b"[1, 2]", {}),  # 400
        (b"{", {}),  # 400
        (b"x" * (webhooks.MAX_BODY_BYTES + 1), {}),  # 413
    ],
)
def test_past_the_rate_limit_a_bad_body_is_still_429(db, hook, monkeypatch, body, headers):
    # The count is answered while the body is checked: the limit's refusal still comes first.
    automation, _, token = hook(rate_limit_per_minute=1)
    clock = datetime(2027, 1, 15, 10, 0, 15, tzinfo=UTC)
    monkeypatch.setattr(webhooks, "timezone", SimpleNamespace(now=lambda: clock))
    assert fire(APIClient(), automation.pk, {}, token=token).status_code == 202

    response = fire(APIClient(), automation.pk, body, token=token, **headers)

    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "RATE_LIMITED"
    assert response["Retry-After"] == "45"
    assert Run.objects.count() == 1


@pytest.mark.skipif(not settings.AUTOPLANE_RATE_LIMIT_REDIS_URL, reason="the Redis lane counts in Redis")
def test_the_rate_limit_keeps_one_redis_connection_per_thread_and_replaces_a_closed_one(db, hook):
    from config import redis_direct

    _, trigger, _ = hook()
    url = settings.AUTOPLANE_RATE_LIMIT_REDIS_URL
    now = 1_800_000_260.0
    assert webhooks.rate_limit_hit(trigger, 5, now) is None
    first = redis_direct.connection(url, 1.0)
    assert webhooks.rate_limit_hit(trigger, 5, now + 1) is None
    assert redis_direct.connection(url, 1.0) is first  # reused, not one per command

    # The server ends the session (a restart, CLIENT KILL): the next count still goes to Redis.
    client = redis.Redis.from_url(url)
    host, port = first._sock.getsockname()[:2]
    client.client_kill(f"{host}:{port}")
    time.sleep(0.05)
    assert webhooks.rate_limit_hit(trigger, 5, now + 2) is None

    assert not WebhookRateWindow.objects.exists()
    assert int(client.get(f"autoplane:webhook-rate:{trigger.pk}:{int(now // 60)}")) == 3


# --- concurrency (separate connections: committed data) --------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_duplicate_fires_with_one_key_start_exactly_one_run(hook, no_enqueue):
    automation, _, token = hook()
    results: list = []
    barrier = threading.Barrier(6)

    def worker():
        try:
            barrier.wait(10)
            response = fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="dup")
            results.append((response.status_code, response.json().get("run_id")))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert len(results) == 6
    assert Run.objects.count() == 1
    run_id = str(Run.objects.get().pk)
    assert sorted(status for status, _ in results).count(202) == 1
    for status, answered in results:
        assert status in (202, 200, 409)
        if status != 409:
            assert answered == run_id


@pytest.mark.parametrize(
    ("original_key", "replay_key"),
    [(None, "added-key"), ("first-key", None), ("first-key", "changed-key"), (None, None)],
    ids=["key added", "key removed", "key changed", "same request"],
)
def test_a_replayed_signed_fire_is_one_run_whatever_its_idempotency_key(db, signed, original_key, replay_key):
    automation, _, token, secret = signed
    body = b'{"a": 1}'
    headers = _signature_headers(secret, body, msg_id="msg_replayed")

    def send(key):
        extra = {"HTTP_IDEMPOTENCY_KEY": key} if key is not None else {}
        return fire(APIClient(), automation.pk, body, token=token, **headers, **extra)

    first = send(original_key)
    replays = [send(replay_key), send("yet-another-key"), send(None)]

    assert first.status_code == 202
    assert [r.status_code for r in replays] == [200, 200, 200]
    assert {r.json()["run_id"] for r in replays} == {first.json()["run_id"]}
    assert Run.objects.count() == 1


# --- the database unavailable ------------------------------------------------------------------------


def _database_down(execute, sql, params, many, context):
    """What a killed or refused connection raises at the driver (fault injection at the DB boundary)."""
    raise OperationalError("server closed the connection unexpectedly")


# the trigger lookup is a SELECT, PREPAREd then EXECUTEd on PostgreSQL (config.one_round_trip.select)
@pytest.mark.parametrize("fails_at", ["INSERT", ("SELECT", "PREPARE", "EXECUTE")], ids=["INSERT", "SELECT"])
def test_a_fire_while_the_database_is_unavailable_is_503_with_retry_after_and_creates_nothing(
    db, hook, fails_at
):
    automation, _, token = hook()

    def down(execute, sql, params, many, context):
        if sql.lstrip().upper().startswith(fails_at):
            _database_down(execute, sql, params, many, context)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(down):
        response = fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="k-1")

    assert response.status_code == 503
    assert response["Retry-After"] == "5"
    assert response.json()["error"]["code"] == "TEMPORARILY_UNAVAILABLE"
    assert "server closed" not in response.content.decode()
    assert not Run.objects.exists()
    retried = fire(APIClient(), automation.pk, {"a": 1}, token=token, HTTP_IDEMPOTENCY_KEY="k-1")
    assert retried.status_code == 202
