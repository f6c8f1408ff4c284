"""The platform's egress deny-list: what no workspace allowlist opens (docs/security.md, "Egress").

Loopback, "this host" (0.0.0.0/8, ::), link-local (169.254.0.0/16, fe80::/10, which hold
the cloud metadata service), the metadata addresses and names (169.254.169.254,
fd00:ec2::254, metadata.google.internal), the hosts of the platform's own database,
broker and result backend (read from its settings, names resolved), and whatever
``settings.AUTOPLANE_EGRESS_DENYLIST`` adds.

A workspace allowlist entry that overlaps it is refused at save (:func:`denied_entry`,
used by ``workspaces.services``); ``capabilities.egress`` checks every resolved address
against it at connect time whatever the allowlists say. Only the deployment allowlist
(``settings.AUTOPLANE_EGRESS_ALLOWLIST``) opens a denied target, and only by naming it: a
host entry equal to the host, or an address/CIDR entry lying wholly inside the deny-list
(``127.0.0.1`` opens loopback's 127.0.0.1; ``10.0.0.0/8`` does not open a database at
10.0.0.5). IPv6 forms embedding an IPv4 address (IPv4-mapped, -compatible, 6to4, NAT64,
Teredo) count as that address; legacy IPv4 spellings (``2130706433``, ``0x7f000001``,
``127.1``) as the address a resolver reads in them.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.conf import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_entries(entries: Iterable[str]) -> tuple[set[str], list[IPNetwork]]:
    """(host names, networks) of allowlist/deny-list entries."""
    hosts: set[str] = set()
    networks: list[IPNetwork] = []
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        network = as_network(entry)
        if network is not None:
            networks.append(network)
        else:
            hosts.add(entry.rstrip("."))
    return hosts, networks


def as_network(text: str) -> IPNetwork | None:
    """``text`` as an address or CIDR (brackets allowed, legacy IPv4 forms read), else None."""
    try:
        return ipaddress.ip_network(text.strip("[]"), strict=False)
    except ValueError:
        legacy = legacy_ipv4(text)
        return ipaddress.ip_network(legacy) if legacy is not None else None


_BUILTIN_DENIED_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "0.0.0.0/8",  # "this host": connecting to 0.0.0.0 reaches the local machine
        "127.0.0.0/8",
        "169.254.0.0/16",  # link-local, the cloud metadata service (169.254.169.254) included
        "100.100.100.200/32",  # Alibaba Cloud's metadata service
        "::/128",
        "::1/128",
        "fe80::/10",
        "fd00:ec2::254/128",  # AWS's IPv6 metadata service
    )
)
# ("localhost" needs no entry: the egress guard reads it as 127.0.0.1 whatever DNS says.)
_BUILTIN_DENIED_HOSTS = frozenset({"metadata.google.internal", "metadata.goog", "instance-data.ec2.internal"})
_RESOLVE_TTL = 60.0
_SAVE_RESOLVE_TIMEOUT = 2.0
_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}
_resolved_lock = threading.Lock()


def ipv4_inside(address: IPAddress) -> list[IPAddress]:
    """``address`` and every IPv4 address an IPv6 form of it embeds."""
    found: list[IPAddress] = [address]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            found.append(address.ipv4_mapped)
        if address.sixtofour is not None:
            found.append(address.sixtofour)
        if address.teredo is not None:
            found.extend(address.teredo)
        as_int = int(address)
        if as_int >> 32 == 0 and as_int > 0xFFFFFF:  # IPv4-compatible ::a.b.c.d (:: and ::1 are themselves)
            found.append(ipaddress.IPv4Address(as_int))
        if address in _NAT64:
            found.append(ipaddress.IPv4Address(as_int & 0xFFFFFFFF))
    return found


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def _ipv6_forms(network: ipaddress.IPv4Network) -> Iterator[ipaddress.IPv6Network]:
    """The IPv6 networks whose addresses embed ``network``'s (mapped, compatible, NAT64, 6to4)."""
    base, prefix = int(network.network_address), network.prefixlen
    yield ipaddress.IPv6Network(((0xFFFF << 32) | base, 96 + prefix))
    yield ipaddress.IPv6Network((base, 96 + prefix))
    yield ipaddress.IPv6Network((int(_NAT64.network_address) | base, 96 + prefix))
    yield ipaddress.IPv6Network(((0x2002 << 112) | (base << 80), 16 + prefix))


def legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a resolver reads in ``text`` when it is not dotted-quad: "2130706433",
    "0x7f000001", "0177.0.0.1", "127.1" -- as ``inet_aton`` (and so ``getaddrinfo``) reads them."""
    if not text or not all(c in "0123456789abcdefx." for c in text) or not text[0].isdigit():
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except (OSError, ValueError):
        return None


def _host_of(value: str) -> str | None:
    if not value or value.startswith("/"):  # a unix socket path
        return None
    return value.strip("[]").lower().rstrip(".") or None


def _platform_hosts() -> set[str]:
    hosts: set[str] = set()
    for database in settings.DATABASES.values():
        host = _host_of(str(database.get("HOST") or ""))
        if host:
            hosts.add(host)
    urls = {
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "CELERY_RESULT_BACKEND": settings.CELERY_RESULT_BACKEND,
        "AUTOPLANE_RATE_LIMIT_REDIS_URL": settings.AUTOPLANE_RATE_LIMIT_REDIS_URL,
    }
    for value in urls.values():
        if not isinstance(value, str) or value.startswith(("sqla+", "db+", "filesystem:", "rpc:")):
            continue  # embedded (files in the data dir) or the broker itself
        for url in value.split(";"):  # Celery takes failover brokers separated by ";"
            try:
                host = _host_of(urlsplit(url.strip()).hostname or "")
            except ValueError:
                continue
            if host:
                hosts.add(host)
    return hosts


def _resolve_cached(host: str) -> tuple[str, ...]:
    now = time.monotonic()
    with _resolved_lock:
        cached = _resolved.get(host)
    if cached is not None and cached[0] > now:
        return cached[1]
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        addresses = tuple(dict.fromkeys(str(info[4][0]).split("%", 1)[0] for info in infos))
    except (OSError, UnicodeError):
        addresses = ()
    with _resolved_lock:
        _resolved[host] = (now + _RESOLVE_TTL, addresses)
    return addresses


@dataclass(frozen=True)
class DenyList:
    hosts: frozenset[str]
    networks: tuple[IPNetwork, ...]

    def denies_host(self, host: str) -> bool:
        return host.lower().rstrip(".") in self.hosts

    def _hits(self, address: IPAddress) -> list[IPAddress]:
        return [a for a in ipv4_inside(address) if any(a in net for net in self.networks)]

    def denies_address(self, address: IPAddress, opened: Sequence[IPNetwork] = ()) -> bool:
        """True if ``address`` (or an IPv4 address it embeds) is denied and ``opened`` does not name it."""
        return any(not any(a in net for net in opened) for a in self._hits(address))

    def overlaps(self, network: IPNetwork) -> bool:
        for denied in self.networks:
            if denied.version == network.version and network.overlaps(denied):
                return True
            if isinstance(denied, ipaddress.IPv4Network) and isinstance(network, ipaddress.IPv6Network):
                if any(network.overlaps(form) for form in _ipv6_forms(denied)):
                    return True
        return False

    def within(self, network: IPNetwork) -> bool:
        """True if every address of ``network`` is denied (an entry that names denied targets only)."""
        return any(
            denied.version == network.version and network.subnet_of(denied)  # type: ignore[arg-type]
            for denied in self.networks
        )


def denylist() -> DenyList:
    """The deny-list now: built in, the platform's own hosts (and their addresses), and
    ``settings.AUTOPLANE_EGRESS_DENYLIST``."""
    hosts = set(_BUILTIN_DENIED_HOSTS)
    networks: list[IPNetwork] = list(_BUILTIN_DENIED_NETWORKS)
    names = _platform_hosts()
    extra_hosts, extra_networks = parse_entries(settings.AUTOPLANE_EGRESS_DENYLIST or ())
    networks.extend(extra_networks)
    for name in names | extra_hosts:
        network = as_network(name)
        if network is not None:
            networks.append(network)
            continue
        hosts.add(name)
        for text in _resolve_cached(name):
            networks.append(ipaddress.ip_network(text))
    return DenyList(frozenset(hosts), tuple(dict.fromkeys(networks)))


def deployment_opened(deny: DenyList) -> tuple[set[str], list[IPNetwork]]:
    """What the deployment allowlist opens in the deny-list: the hosts it names, and its
    address/CIDR entries that lie wholly inside the deny-list."""
    hosts, networks = parse_entries(settings.AUTOPLANE_EGRESS_ALLOWLIST or ())
    return hosts, [net for net in networks if deny.within(net)]


def _resolve_bounded(host: str) -> tuple[str, ...]:
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(_resolve_cached, host).result(timeout=_SAVE_RESOLVE_TIMEOUT)
    except concurrent.futures.TimeoutError:
        return ()  # the connect-time check still holds
    finally:
        pool.shutdown(wait=False)


def denied_entry(entry: str) -> str | None:
    """Why a workspace allowlist entry may not be saved (it overlaps the deny-list), or None.

    ``entry`` is a host name, an IP address or a CIDR (brackets and legacy IPv4 forms such
    as ``2130706433`` read as the address they are). A host name is also resolved (bounded
    in time): a name whose addresses are denied is refused too.
    """
    deny = denylist()
    text = entry.strip().lower().rstrip(".")
    network = as_network(text)
    if network is not None:
        if deny.overlaps(network):
            return f"{entry} overlaps the platform's egress deny-list (loopback, link-local and metadata, "\
                   "the platform's own database and broker hosts, AUTOPLANE_EGRESS_DENYLIST)"  # fmt: skip
        return None
    if deny.denies_host(text) or text == "localhost" or text.endswith(".localhost"):
        return f"{entry} is on the platform's egress deny-list"
    for address in _resolve_bounded(text):
        if deny.denies_address(ipaddress.ip_address(address)):
            return f"{entry} resolves to {address}, which is on the platform's egress deny-list"
    return None
