"""``ops.asgi``'s application with ``bench --http --trace``'s stamps (see :mod:`bench.trace`)."""

from __future__ import annotations

import time

from ops import asgi

from . import trace


def _install() -> None:
    from django.db.models.signals import post_save

    from automations import enqueue
    from automations.models import Run
    from triggers import webhooks

    wsgi_app = asgi.application.app

    def traced_wsgi(environ, start_response):
        key = environ.get(trace.ENV_HEADER)
        if not key:
            return wsgi_app(environ, start_response)
        trace.stamp(key, "web.wsgi")
        trace.set_key(key)
        try:
            return wsgi_app(environ, start_response)
        finally:
            trace.set_key(None)
            trace.stamp(key, "web.response")

    asgi.application.app = traced_wsgi

    fire, dispatch, publish = webhooks.webhook_fire, webhooks.dispatch, enqueue.publish_run

    def traced_fire(request, **kwargs):
        if (key := trace.current_key()) is not None:
            trace.stamp(key, "web.view")
        return fire(request, **kwargs)

    def traced_dispatch(request):
        if (key := trace.current_key()) is not None:
            trace.stamp(key, "web.dispatch")
        return dispatch(request)

    def traced_publish(run_id, queue, **kwargs):
        key = trace.current_key()
        if key is not None:
            trace.stamp(run_id, "db.committed")
        try:
            return publish(run_id, queue, **kwargs)
        finally:
            if key is not None:
                trace.stamp(run_id, "broker.published")

    def inserted(sender, instance, created, **kwargs):
        if created and (key := trace.current_key()) is not None:
            trace.stamp(str(instance.pk), "run.inserted")
            trace.link(key, str(instance.pk))

    webhooks.webhook_fire, webhooks.dispatch, enqueue.publish_run = (
        traced_fire,
        traced_dispatch,
        traced_publish,
    )
    post_save.connect(inserted, sender=Run, weak=False)


_install()
_inner = asgi.application


async def application(scope, receive, send):
    if scope["type"] == "http":
        for name, value in scope.get("headers") or ():
            if name == b"x-bench-trace":
                trace.stamp(value.decode("ascii", "replace"), "web.asgi", time.time())
                break
    await _inner(scope, receive, send)
