"""Outbound HTTP guard: which addresses a step may reach, and a client that only reaches them.

SSRF rule: a URL is refused (``POLICY_VIOLATION``) when its scheme is not
http(s) or when *any* address its host resolves to is not a public unicast
address — private, loopback, link-local (incl. 169.254.169.254), CGNAT,
multicast, reserved, unspecified, or an IPv6 form embedding one of those
(IPv4-mapped, 6to4, Teredo) — unless the host or the address is allowlisted.
Allowlist entries are hostnames (exact match), IP addresses or CIDRs; the
workspace's ``egress_allowlist`` is combined with the deployment-wide
``settings.AUTOPLANE_EGRESS_ALLOWLIST``.

DNS rebinding: checking a name and then letting the HTTP library resolve it
again would let a hostile DNS server answer "public" to the check and
"127.0.0.1" to the connect. :class:`EgressClient` therefore resolves once,
checks those addresses, and pins them in an httpcore network backend whose
``connect_tcp`` dials only pinned addresses (and refuses any host it was not
told about). Everything above the TCP socket is unchanged: the request still
carries ``Host: <name>``, and TLS still sends SNI for and verifies the
certificate against the URL's hostname, because httpcore takes those from the
request origin, not from the socket.

Deny-list (``workspaces.denylist``): loopback, link-local and cloud metadata, the
platform's own database and broker hosts and ``AUTOPLANE_EGRESS_DENYLIST`` are refused
at connect time, every resolved address checked, whatever a workspace allowlists; only
a deployment allowlist entry naming a denied target opens it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import httpcore
import httpx
from django.conf import settings

from workspaces import denylist

from .base import ErrorCode, StepFailure

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

ALLOWED_SCHEMES = frozenset({"http", "https"})
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


def deployment_allowlist() -> tuple[str, ...]:
    return tuple(settings.AUTOPLANE_EGRESS_ALLOWLIST or ())


def effective_allowlist(workspace_allowlist: Iterable[str]) -> tuple[str, ...]:
    return tuple(workspace_allowlist) + deployment_allowlist()


def is_forbidden_address(address: IPAddress) -> bool:
    """True for anything that is not a plain public unicast address, nor an IPv6 form wrapping one
    (IPv4-mapped, 6to4, Teredo, IPv4-compatible, NAT64: ``denylist.ipv4_inside``)."""
    candidates = denylist.ipv4_inside(address)
    return any(
        a.is_private
        or a.is_loopback
        or a.is_link_local
        or a.is_multicast
        or a.is_reserved
        or a.is_unspecified
        or a in _CGNAT
        or not a.is_global
        for a in candidates
    )


def parse_url(url: str | httpx.URL) -> httpx.URL:
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, "the URL is not valid", detail=str(exc))
    if parsed.scheme not in ALLOWED_SCHEMES:
        raise StepFailure(ErrorCode.POLICY_VIOLATION, "only http and https URLs are allowed")
    if not parsed.raw_host:
        raise StepFailure(ErrorCode.INVALID_ARGUMENT, "the URL has no host")
    return parsed


def connect_host(url: httpx.URL) -> str:
    """The host string httpcore will hand to ``connect_tcp`` for ``url``."""
    return url.raw_host.decode("ascii").lower()


def resolve_url(url: str | httpx.URL, allowlist: Iterable[str]) -> tuple[str, ...]:
    """Resolve ``url``'s host, refuse it unless every address may be reached, return the addresses."""
    parsed = parse_url(url)
    host = connect_host(parsed)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    # The deny-list first, whatever the allowlists say.
    deny = denylist.denylist()
    opened_hosts, opened_networks = denylist.deployment_opened(deny)
    names = {host.rstrip("."), parsed.host.rstrip(".").lower()}
    opened = bool(names & opened_hosts)
    if not opened and any(deny.denies_host(name) for name in names):
        raise _denied(parsed.host, parsed.host)
    addresses = _resolve(host, port)
    if not opened:
        for text in addresses:
            if deny.denies_address(ipaddress.ip_address(text), opened_networks):
                raise _denied(parsed.host, text)

    hosts, networks = denylist.parse_entries(allowlist)
    if {host.rstrip("."), parsed.host.rstrip(".")} & hosts:
        return addresses
    for text in addresses:
        address = ipaddress.ip_address(text)
        if any(address in network for network in networks):
            continue
        if is_forbidden_address(address):
            raise StepFailure(
                ErrorCode.POLICY_VIOLATION,
                f"requests to {parsed.host} are not allowed: it resolves to a private or reserved address",
                detail=f"{parsed.host} -> {text}",
            )
    return addresses


def reaches_non_public(url: str | httpx.URL) -> bool:
    """True if ``url``'s host is deny-listed or resolves to any address that is not plain public
    unicast (whatever an allowlist says). A URL that is invalid or does not resolve is not
    judged here: fetching it fails on its own."""
    try:
        parsed = parse_url(url)
        host = connect_host(parsed)
        deny = denylist.denylist()
        if deny.denies_host(host):
            return True
        addresses = _resolve(host, parsed.port or (443 if parsed.scheme == "https" else 80))
    except StepFailure:
        return False
    return any(
        is_forbidden_address(ipaddress.ip_address(text)) or deny.denies_address(ipaddress.ip_address(text))
        for text in addresses
    )


def _denied(host: str, target: str) -> StepFailure:
    return StepFailure(
        ErrorCode.POLICY_VIOLATION,
        f"requests to {host} are not allowed: it is on the platform's egress deny-list",
        detail=f"{host} -> {target}",
    )


def _resolve(host: str, port: int) -> tuple[str, ...]:
    name = host.rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        # RFC 6761: always loopback, whatever a resolver (or its absence) says.
        return ("127.0.0.1",)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise StepFailure(
            ErrorCode.TEMPORARILY_UNAVAILABLE, f"could not resolve host {host}", detail=str(exc)
        )
    # Strip an IPv6 zone id ("fe80::1%eth0") before parsing.
    addresses = tuple(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    if not addresses:
        raise StepFailure(ErrorCode.TEMPORARILY_UNAVAILABLE, f"could not resolve host {host}")
    return addresses


def check_url(url: str | httpx.URL, allowlist: Iterable[str]) -> None:
    """Raise ``StepFailure(POLICY_VIOLATION)`` unless ``url`` may be fetched."""
    resolve_url(url, allowlist)


class _TrackedStream(httpcore.NetworkStream):
    """A connection the backend remembers, so that :meth:`AbortableBackend.abort` can shut it down."""

    def __init__(self, inner: httpcore.NetworkStream, streams: list[httpcore.NetworkStream]) -> None:
        self._inner = inner
        self._streams = streams
        streams.append(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:  # fmt: skip
        return _TrackedStream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._streams)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class AbortableBackend(httpcore.NetworkBackend):
    """httpcore's network backend, remembering its connections so that :meth:`abort` can shut
    them down from another thread (a cancel abandoning a call in flight)."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()
        self._streams: list[httpcore.NetworkStream] = []
        self._aborted = False

    def abort(self) -> None:
        """Shut down every connection this backend opened, from any thread: a call blocked
        on one of them (connecting TLS, sending, waiting for the answer) fails at once."""
        self._aborted = True
        for stream in list(self._streams):
            sock = stream.get_extra_info("socket")
            if sock is None or sock.fileno() == -1:  # closed, or handed over to its TLS wrapper
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        return self._track(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def _track(self, stream: httpcore.NetworkStream) -> httpcore.NetworkStream:
        tracked = _TrackedStream(stream, self._streams)
        if self._aborted:  # aborted while this connection was being made: it is not used either
            self.abort()
        return tracked

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not reachable from steps")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class PinnedBackend(AbortableBackend):
    """A network backend that connects only to addresses pinned for a host."""

    def __init__(self) -> None:
        super().__init__()
        self._pins: dict[str, tuple[str, ...]] = {}

    def pin(self, host: str, addresses: Sequence[str]) -> None:
        self._pins[host] = tuple(addresses)

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._pins.get(host.lower())
        if not addresses:
            raise httpcore.ConnectError(f"{host} was not checked by the egress guard")
        error: Exception | None = None
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
                return self._track(stream)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                error = exc
        assert error is not None
        raise error


class PinnedTransport(httpx.HTTPTransport):
    """An httpx transport whose connections go through ``backend`` (pinned, abortable)."""

    def __init__(self, backend: AbortableBackend, *, verify: Any = True) -> None:
        super().__init__(verify=verify, trust_env=False)
        # httpx (0.28) has no public parameter for the network backend, so the
        # pool it built is replaced by an identical one that uses ours.
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=10,
            max_keepalive_connections=5,
            network_backend=backend,
        )


class EgressClient:
    """An httpx client whose every request is checked by :func:`resolve_url` and pinned."""

    def __init__(self, allowlist: Iterable[str], *, verify: Any = True) -> None:
        self.allowlist = tuple(allowlist)
        self._backend = PinnedBackend()
        # trust_env=False: no proxies, netrc or CA bundle from the environment.
        self._client = httpx.Client(
            transport=PinnedTransport(self._backend, verify=verify), trust_env=False, follow_redirects=False
        )

    def check(self, url: str | httpx.URL) -> httpx.URL:
        """Check ``url`` and pin its addresses; returns the parsed URL."""
        parsed = parse_url(url)
        self._backend.pin(connect_host(parsed), resolve_url(parsed, self.allowlist))
        return parsed

    def stream(
        self, method: str, url: str | httpx.URL, **kwargs: Any
    ) -> AbstractContextManager[httpx.Response]:
        return self._client.stream(method, self.check(url), **kwargs)

    def abort(self) -> None:
        """Abandon the request in flight (callable from another thread): its connection is shut down."""
        self._backend.abort()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> EgressClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
