"""``manage.py check --deploy`` advice on the web edge's settings (``manage.py doctor`` reports it too).

Each message says what a stranger could do with the setting as it is; none stops the
server (they are warnings: a laptop or a private network may mean them).
"""

from __future__ import annotations

from django.conf import settings
from django.core import checks

MIN_METRICS_TOKEN = 24


def edge_advice() -> list[checks.CheckMessage]:
    advice: list[checks.CheckMessage] = []
    token = settings.AUTOPLANE_METRICS_TOKEN
    if not token:
        advice.append(checks.Warning(
            "/metrics is open to anyone who can reach the web server (queues, processes, backlogs, counts).",
            hint="Set AUTOPLANE_METRICS_TOKEN and give it to Prometheus (authorization: credentials).",
            id="autoplane.W001",
        ))  # fmt: skip
    elif len(token) < MIN_METRICS_TOKEN or len(set(token)) < 5:
        advice.append(checks.Warning(
            f"AUTOPLANE_METRICS_TOKEN is shorter than {MIN_METRICS_TOKEN} characters or repetitive.",
            hint="Use a random token, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'.",
            id="autoplane.W002",
        ))  # fmt: skip
    if settings.AUTOPLANE_HEALTHZ_DETAILS == "public":
        advice.append(checks.Warning(
            "/healthz tells anonymous callers its whole report (queues, processes, sandbox backend).",
            hint="AUTOPLANE_HEALTHZ_DETAILS=private: status only for them; staff and the metrics token see all.",
            id="autoplane.W003",
        ))  # fmt: skip
    if settings.SECURE_PROXY_SSL_HEADER and settings.AUTOPLANE_TRUSTED_PROXY_HOPS == 0:
        advice.append(checks.Warning(
            "A TLS proxy is trusted (SECURE_PROXY_SSL_HEADER) but AUTOPLANE_TRUSTED_PROXY_HOPS is 0: every "
            "client has the proxy's address, so one sender's failed webhook or admin logins block them all.",
            hint="Set AUTOPLANE_TRUSTED_PROXY_HOPS to the number of proxies that append X-Forwarded-For (1).",
            id="autoplane.W004",
        ))  # fmt: skip
    if settings.AUTOPLANE_BODY_READ_TIMEOUT_SECONDS > 60:
        advice.append(checks.Warning(
            f"AUTOPLANE_BODY_READ_TIMEOUT_SECONDS is {settings.AUTOPLANE_BODY_READ_TIMEOUT_SECONDS:g}: a client "
            "trickling a request body holds its connection (and up to 2.5 MB) that long.",
            hint="10-30 s is ample for honest clients (bodies are at most 2.5 MB).",
            id="autoplane.W005",
        ))  # fmt: skip
    return advice


@checks.register(checks.Tags.security, deploy=True)
def check_edge_settings(app_configs=None, **kwargs) -> list[checks.CheckMessage]:
    return edge_advice()
