"""``POST /fire`` is a plain Django view (no DRF dispatch on the hot path) that answers exactly
as the DRF APIView that documents the endpoint does: status, body and headers."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import RequestFactory

from automations.models import Run
from tests.factories import definition, webhook
from triggers.api import views
from triggers.models import Trigger
from triggers.services import trigger_token_rotate

pytestmark = pytest.mark.django_db


def _both(request_for) -> tuple:
    """The DRF view's and the plain view's answers to the same request (built twice)."""
    answers = []
    for view in (views.AutomationFire.as_view(), views.automation_fire):
        request, automation_id = request_for()
        response = view(request, automation_id=automation_id)
        if hasattr(response, "render"):
            response = response.render()
        answers.append(response)
    return tuple(answers)


def _headers(response) -> dict:
    return {k: v for k, v in response.headers.items() if k.lower() != "content-length"}


@pytest.mark.parametrize(
    ("case", "body", "content_type", "extra", "status"),
    [
        ("no token", b"{}", "application/json", {"HTTP_AUTHORIZATION": ""}, 401),
        ("not JSON", b"a=1", "application/x-www-form-urlencoded", {}, 415),
        ("bad JSON", b'{"a": NaN}', "application/json", {}, 400),
        ("not an object", b"[1]", "application/json", {}, 400),
        ("encoded", b"{}", "application/json", {"HTTP_CONTENT_ENCODING": "gzip"}, 415),
        ("too large", b"{}", "application/json", {"CONTENT_LENGTH": str(10**7)}, 413),
        ("inputs refused", b'{"n": "x"}', "application/json", {}, 400),
    ],
)
def test_every_refusal_is_the_same_answer_from_both_views(make_automation, owner, case, body, content_type, extra,
                                                          status):  # fmt: skip
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    automation = make_automation(definition(name="typed", triggers=[webhook()], inputs_schema=schema))
    token = trigger_token_rotate(trigger=Trigger.objects.get(automation=automation), user=owner)
    factory = RequestFactory()

    def request_for():
        headers = {"HTTP_AUTHORIZATION": f"Bearer {token}", **extra}
        return factory.generic("POST", f"/api/v1/automations/{automation.pk}/fire", body,
                               content_type=content_type, **headers), str(automation.pk)  # fmt: skip

    drf, plain = _both(request_for)

    assert drf.status_code == plain.status_code == status, (case, drf.content, plain.content)
    assert plain.content == drf.content
    assert _headers(plain) == _headers(drf)


def test_an_accepted_fire_and_other_methods_answer_as_the_drf_view_does(hook, no_enqueue):
    automation, _, token = hook()
    factory = RequestFactory()

    def fire():
        return factory.post(f"/api/v1/automations/{automation.pk}/fire", b'{"n": 1}', content_type="application/json",
                            HTTP_AUTHORIZATION=f"Bearer {token}"), str(automation.pk)  # fmt: skip

    drf, plain = _both(fire)
    assert drf.status_code == plain.status_code == 202
    drf_body, plain_body = json.loads(drf.content), json.loads(plain.content)
    assert set(plain_body) == set(drf_body) == {"run_id", "status_url", "status"}
    assert plain_body["status_url"] == f"/api/v1/runs/{plain_body['run_id']}"
    assert Run.objects.filter(pk=plain_body["run_id"], status=plain_body["status"]).exists()
    assert plain.content == drf.content.replace(drf_body["run_id"].encode(), plain_body["run_id"].encode())
    assert _headers(plain) == _headers(drf)

    for method in ("GET", "PUT", "OPTIONS"):
        drf, plain = _both(lambda m=method: (factory.generic(m, "/fire"), str(automation.pk)))
        assert (plain.status_code, plain.content, _headers(plain)) == (
            drf.status_code,
            drf.content,
            _headers(drf),
        )


@pytest.mark.parametrize("automation_id", [str(uuid.uuid4()), "not-a-uuid"])
def test_the_fire_route_is_tried_first_and_shadows_no_other_route(automation_id):
    from django.urls import Resolver404, URLResolver, resolve
    from django.urls.resolvers import RegexPattern

    from config import api_urls

    path = f"/api/v1/automations/{automation_id}/fire"
    assert api_urls.urlpatterns[0].name == "automation-fire"
    assert resolve(path).url_name == "automation-fire"
    others = URLResolver(RegexPattern(r"^/api/v1/"), api_urls.urlpatterns[1:])
    with pytest.raises(Resolver404):
        others.resolve(path)


def test_the_fire_views_headers_read_meta_as_django_does():
    request = RequestFactory().post(
        "/x", b"{}", content_type="application/json; charset=utf-8",
        HTTP_AUTHORIZATION="Bearer t", HTTP_IDEMPOTENCY_KEY="k", HTTP_WEBHOOK_ID="msg_1",
        HTTP_CONTENT_ENCODING="gzip",
    )  # fmt: skip
    mine = views._MetaHeaders(request.META)

    for name in ("Authorization", "authorization", "Content-Type", "content-type", "Content-Length",
                 "Content-Encoding", "Idempotency-Key", "webhook-id", "Webhook-Id", "webhook-signature"):  # fmt: skip
        assert mine.get(name) == request.headers.get(name), name
    assert dict(mine) == dict(request.headers)
