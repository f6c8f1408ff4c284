"""Who may read what ``/healthz`` and ``/metrics`` say beyond "up or not".

A stranger learns the platform's topology from them (queues, processes, the sandbox
backend, backlogs, counts): so ``/healthz`` tells an anonymous caller its status only
(the status code is unchanged, for load balancers and ``curl -sf``), and ``/metrics``
needs a caller once ``AUTOPLANE_METRICS_TOKEN`` is set. A trusted caller is a staff
user's session (the admin) or ``Authorization: Bearer <AUTOPLANE_METRICS_TOKEN>``
(a Prometheus scrape config's ``authorization`` block).
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest


def bearer_is_metrics_token(request: HttpRequest) -> bool:
    expected = settings.AUTOPLANE_METRICS_TOKEN
    if not expected:
        return False
    scheme, _, token = (request.META.get("HTTP_AUTHORIZATION") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), expected.encode())


def is_ops_caller(request: HttpRequest) -> bool:
    """A staff session or the metrics token."""
    if bearer_is_metrics_token(request):
        return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_authenticated and user.is_staff and user.is_active)


def may_read_health_details(request: HttpRequest) -> bool:
    return settings.AUTOPLANE_HEALTHZ_DETAILS == "public" or is_ops_caller(request)


def may_read_metrics(request: HttpRequest) -> bool:
    return not settings.AUTOPLANE_METRICS_TOKEN or is_ops_caller(request)
