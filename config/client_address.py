"""The client's address, as the deployment's trusted proxies saw it.

``REMOTE_ADDR`` is the peer of the web server. Behind ``AUTOPLANE_TRUSTED_PROXY_HOPS``
reverse proxies (the recommended TLS proxy is one), every request's peer is the last
proxy, and each proxy appends the address it saw to ``X-Forwarded-For``. So the client
is the entry that many hops from the right: entries further left were written by the
client itself and are never trusted. With 0 hops (the default: no proxy) the header is
ignored. When the header has fewer entries than the hops, the left-most one is taken
(a proxy chain shorter than configured: the best address there is).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

from django.conf import settings


def _address(text: str) -> str | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6]:port
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.split(":", 1)[0]
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def client_address(meta: Mapping[str, str], *, hops: int | None = None) -> str:
    """The client's address for rate limits and blocks (``request.META`` in), "" when unknown."""
    hops = settings.AUTOPLANE_TRUSTED_PROXY_HOPS if hops is None else hops
    remote = meta.get("REMOTE_ADDR", "")
    if hops <= 0:
        return remote
    entries = [entry for entry in (meta.get("HTTP_X_FORWARDED_FOR") or "").split(",") if entry.strip()]
    if not entries:
        return remote
    chosen = _address(entries[max(0, len(entries) - hops)])
    return chosen if chosen is not None else remote


def request_client_address(request) -> str:
    """:func:`client_address` of a Django request (django-axes' ``AXES_CLIENT_IP_CALLABLE``)."""
    return client_address(request.META)
