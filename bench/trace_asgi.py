"""``ops.asgi``'s application with ``bench --http --trace``'s stamps (see :mod:`bench.trace`)."""

from __future__ import annotations

import time

from ops import asgi

from . import trace


def _install() -> None:
    from automations import dispatcher, enqueue
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

    created = dispatcher._created

    def traced_created(request, automation, run, **kwargs):  # rows written (committed, on PostgreSQL)
        if (key := trace.current_key()) is not None:
            trace.stamp(str(run.pk), "run.inserted")
            trace.link(key, str(run.pk))
        return created(request, automation, run, **kwargs)

    webhooks.webhook_fire, webhooks.dispatch, enqueue.publish_run = (
        traced_fire,
        traced_dispatch,
        traced_publish,
    )
    dispatcher._created = traced_created


_install()
_inner = asgi.application


async def application(scope, receive, send):
    if scope["type"] == "http":
        for name, value in scope.get("headers") or ():
            if name == b"x-bench-trace":
                trace.stamp(value.decode("ascii", "replace"), "web.asgi", time.time())
                break
    await _inner(scope, receive, send)
