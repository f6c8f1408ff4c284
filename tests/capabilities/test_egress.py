"""The SSRF guard (capabilities.egress) and http_request's use of it, against real local servers."""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from capabilities import egress
from capabilities.base import ActionContext, ErrorCode, StepFailure
from capabilities.builtin import http_request
from workspaces import denylist


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(url.query)["to"][0])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"ok": true, "host": "%s"}' % self.headers.get("Host", "").encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _serve(server: ThreadingHTTPServer) -> Iterator[ThreadingHTTPServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[ThreadingHTTPServer]:
    yield from _serve(ThreadingHTTPServer(("127.0.0.1", 0), _Handler))


@pytest.fixture(autouse=True)
def _no_deployment_allowlist(settings) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = []


@pytest.fixture
def loopback_opened(settings) -> None:
    """The local test servers are on loopback, which only the deployment allowlist opens."""
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.1"]


def _ctx(allowlist: tuple[str, ...] = ()) -> ActionContext:
    return ActionContext(
        run_id="run-1",
        step_id="fetch",
        attempt=1,
        workspace_id=1,
        trace_id="trace-1",
        idempotency_key="run-1:fetch",
        timeout_seconds=5,
        egress_allowlist=allowlist,
    )


def _loopback_names_from_hosts_file() -> list[str]:
    """Names other than 'localhost' that /etc/hosts maps to a loopback address."""
    names = []
    for line in Path("/etc/hosts").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            if ipaddress.ip_address(fields[0]).is_loopback:
                names += [n for n in fields[1:] if n != "localhost" and "localhost" not in n]
        except ValueError:
            continue
    return names[:2]


REFUSED_URLS = [
    "http://127.0.0.1/",
    "http://10.0.0.1/",
    "http://192.168.1.1/",
    "http://172.16.0.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
    "http://localhost/",
    "http://LOCALHOST./",
    "http://[::1]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[2002:7f00:1::]/",  # 6to4 wrapping 127.0.0.1
    "http://2130706433/",  # decimal 127.0.0.1
    "http://0x7f000001/",  # hex
    "http://127.1/",  # short form
    "https://127.0.0.1:8443/x",
] + [f"http://{name}/" for name in _loopback_names_from_hosts_file()]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_check_url_refuses_internal_targets(url: str) -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url(url, [])

    assert info.value.code == ErrorCode.POLICY_VIOLATION
    assert info.value.retryable is False


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_http_request_refuses_internal_targets(url: str) -> None:
    with pytest.raises(StepFailure) as info:
        http_request.ACTION.handler(_ctx(), {"method": "GET", "url": url})

    assert info.value.code == ErrorCode.POLICY_VIOLATION


def test_octal_ip_form_is_refused_as_an_invalid_url() -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url("http://0177.0.0.1/", [])

    assert info.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("url", "allowlist"),
    [
        ("http://10.0.0.1/", ["10.0.0.0/8"]),
        ("http://192.168.7.9/", ["192.168.7.0/24"]),
        ("http://[fc00::5]/", ["fc00::/7"]),
    ],
)
def test_check_url_allows_allowlisted_hosts_and_networks(url: str, allowlist: list[str]) -> None:
    egress.check_url(url, allowlist)


DENIED_OPENINGS = [
    ("http://127.0.0.1/", ["127.0.0.1"]),
    ("http://2130706433/", ["127.0.0.0/8"]),
    ("http://localhost/", ["localhost"]),
    ("http://LocalHost./", ["localhost"]),
    ("http://169.254.169.254/", ["169.254.169.254/32"]),
    ("http://[::1]/", ["::1"]),
    ("http://[::1]/", ["[::1]"]),
    ("http://[::ffff:127.0.0.1]/", ["::ffff:127.0.0.1"]),
    ("http://127.0.0.1/", ["0.0.0.0/0"]),
]


@pytest.mark.parametrize(("url", "allowlist"), DENIED_OPENINGS)
def test_a_workspace_allowlist_never_opens_the_deny_list(url: str, allowlist: list[str]) -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url(url, egress.effective_allowlist(allowlist))

    assert info.value.code == ErrorCode.POLICY_VIOLATION
    assert "deny-list" in info.value.message


@pytest.mark.parametrize(("url", "allowlist"), DENIED_OPENINGS[:7])
def test_the_deployment_allowlist_opens_a_denied_target_by_naming_it(
    url: str, allowlist: list[str], settings
) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = allowlist

    egress.check_url(url, egress.effective_allowlist([]))


def test_a_broad_deployment_entry_does_not_open_the_deny_list(settings) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["0.0.0.0/0", "::/0"]

    egress.check_url("http://10.0.0.1/", egress.effective_allowlist([]))  # private, opened
    for url in ("http://127.0.0.1/", "http://169.254.169.254/", "http://[::1]/"):
        with pytest.raises(StepFailure, match="deny-list"):
            egress.check_url(url, egress.effective_allowlist([]))


def test_a_name_that_resolves_into_the_deny_list_is_refused_even_when_allowlisted(monkeypatch) -> None:
    """DNS rebinding/hostile DNS: a workspace may list a name; what it resolves to is checked."""
    real_getaddrinfo = socket.getaddrinfo

    def hostile(host, *args, **kwargs):
        if host == "friendly.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 80))]
        if host == "meta.example":
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::ffff:169.254.169.254", 80, 0, 0))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", hostile)
    for name in ("friendly.example", "meta.example"):
        with pytest.raises(StepFailure, match="deny-list") as info:
            egress.check_url(f"http://{name}/", [name, "0.0.0.0/0", "::/0"])
        assert info.value.code == ErrorCode.POLICY_VIOLATION


@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES")
def test_the_platform_database_and_broker_hosts_are_denied(settings, monkeypatch) -> None:
    real_getaddrinfo = socket.getaddrinfo
    addresses = {"db.internal": "10.9.8.7", "broker.internal": "10.9.8.6"}

    def fake(host, *args, **kwargs):
        if host in addresses:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addresses[host], 5432))]
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", fake)
    monkeypatch.setattr(denylist, "_resolved", {})  # no answer cached from another test
    settings.DATABASES = {
        **settings.DATABASES,
        "platform": {**settings.DATABASES["default"], "HOST": "db.internal"},
    }
    settings.CELERY_BROKER_URL = "redis://:secret@broker.internal:6379/0"
    settings.AUTOPLANE_EGRESS_DENYLIST = ["10.20.0.0/16", "vault.internal"]

    for url in ("http://db.internal:5432/", "http://10.9.8.7/", "http://broker.internal/", "http://10.9.8.6:6379/",
                "http://10.20.1.1/", "http://vault.internal/"):  # fmt: skip
        with pytest.raises(StepFailure, match="deny-list"):
            egress.check_url(url, ["10.0.0.0/8", "db.internal", "broker.internal", "vault.internal"])
    egress.check_url("http://10.9.8.5/", ["10.0.0.0/8"])  # the rest of the private network stays open


def test_deployment_allowlist_is_combined_with_the_workspace_one(settings) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["10.0.0.0/8"]

    allowlist = egress.effective_allowlist(["192.168.5.0/24"])

    egress.check_url("http://10.1.2.3/", allowlist)
    egress.check_url("http://192.168.5.1/", allowlist)
    with pytest.raises(StepFailure):
        egress.check_url("http://192.168.0.1/", allowlist)


def test_an_allowlisted_address_does_not_cover_other_addresses() -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url("http://127.0.0.2/", ["127.0.0.1"])

    assert info.value.code == ErrorCode.POLICY_VIOLATION


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/", "gopher://127.0.0.1:70/"])
def test_non_http_schemes_are_refused(url: str) -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url(url, ["127.0.0.0/8"])

    assert info.value.code == ErrorCode.POLICY_VIOLATION


def test_public_address_is_allowed_without_an_allowlist() -> None:
    assert egress.resolve_url("http://93.184.216.34/", []) == ("93.184.216.34",)


def test_unresolvable_host_is_temporarily_unavailable() -> None:
    with pytest.raises(StepFailure) as info:
        egress.check_url("http://does-not-exist.invalid/", [])

    assert info.value.code == ErrorCode.TEMPORARILY_UNAVAILABLE


def test_allowlisted_server_is_reachable(server: ThreadingHTTPServer, loopback_opened: None) -> None:
    port = server.server_address[1]

    envelope = http_request.ACTION.handler(_ctx(("127.0.0.1",)), {"url": f"http://127.0.0.1:{port}/"})

    assert envelope.ok
    assert envelope.data["body"]["ok"] is True


def test_deployment_allowlist_alone_makes_a_server_reachable(server: ThreadingHTTPServer, settings) -> None:
    settings.AUTOPLANE_EGRESS_ALLOWLIST = ["127.0.0.0/8"]
    port = server.server_address[1]

    envelope = http_request.ACTION.handler(_ctx(), {"url": f"http://127.0.0.1:{port}/"})

    assert envelope.ok


@pytest.mark.parametrize(
    "target",
    [
        "http://[::1]:{port}/",
        "http://127.0.0.2:{port}/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://0x7f000002:{port}/",
        "file:///etc/passwd",
    ],
)
def test_redirect_from_allowlisted_server_to_internal_target_is_refused(
    server: ThreadingHTTPServer, target: str, loopback_opened: None
) -> None:
    port = server.server_address[1]
    location = target.format(port=port)

    with pytest.raises(StepFailure) as info:
        http_request.ACTION.handler(
            _ctx(("127.0.0.1",)),
            {"url": f"http://127.0.0.1:{port}/redirect", "params": {"to": location}},
        )

    assert info.value.code == ErrorCode.POLICY_VIOLATION


def test_redirect_to_an_allowlisted_target_is_followed(
    server: ThreadingHTTPServer, loopback_opened: None
) -> None:
    port = server.server_address[1]

    envelope = http_request.ACTION.handler(
        _ctx(("127.0.0.1",)),
        {"url": f"http://127.0.0.1:{port}/redirect", "params": {"to": f"http://127.0.0.1:{port}/final"}},
    )

    assert envelope.ok
    assert envelope.data["status"] == 200


def test_connection_goes_to_the_checked_address_not_a_second_lookup(
    server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch, loopback_opened: None
) -> None:
    """DNS rebinding: the first answer is checked; later answers must not be used."""
    port = server.server_address[1]
    real_getaddrinfo = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding_getaddrinfo(host, *args, **kwargs):
        if host != "rebind.test":
            return real_getaddrinfo(host, *args, **kwargs)
        lookups.append(host)
        answer = "127.0.0.1" if len(lookups) == 1 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding_getaddrinfo)

    envelope = http_request.ACTION.handler(_ctx(("127.0.0.1",)), {"url": f"http://rebind.test:{port}/"})

    assert envelope.ok
    assert lookups == ["rebind.test"]
    assert envelope.data["body"]["host"] == f"rebind.test:{port}"  # Host header keeps the name


def test_pinned_backend_refuses_hosts_it_was_not_told_about() -> None:
    with pytest.raises(httpx.ConnectError):
        with httpx.Client(transport=egress.PinnedTransport(egress.PinnedBackend())) as client:
            client.get("http://127.0.0.1:9/")


# --- TLS through a pinned connection: SNI and verification use the URL's hostname ---------


def _certificate_for(hostname: str, tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path, list[str]]]:
    cert_path, key_path = _certificate_for("pinned.test", tmp_path)
    server_names: list[str] = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    context.sni_callback = lambda sock, name, ctx: server_names.append(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    for running in _serve(server):
        yield running.server_address[1], cert_path, server_names


def test_tls_through_a_pinned_address_sends_sni_and_verifies_the_hostname(tls_server) -> None:
    port, ca_path, server_names = tls_server
    backend = egress.PinnedBackend()
    backend.pin("pinned.test", ["127.0.0.1"])
    verify = ssl.create_default_context(cafile=str(ca_path))

    with httpx.Client(transport=egress.PinnedTransport(backend, verify=verify)) as client:
        response = client.get(f"https://pinned.test:{port}/")

    assert response.status_code == 200
    assert server_names == ["pinned.test"]
    assert response.json()["host"] == f"pinned.test:{port}"


def test_tls_through_a_pinned_address_still_rejects_a_certificate_for_another_name(tls_server) -> None:
    port, ca_path, _ = tls_server
    backend = egress.PinnedBackend()
    backend.pin("other.test", ["127.0.0.1"])
    verify = ssl.create_default_context(cafile=str(ca_path))

    with httpx.Client(transport=egress.PinnedTransport(backend, verify=verify)) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            client.get(f"https://other.test:{port}/")


@pytest.mark.parametrize(
    "address", ["64:ff9b::a00:1", "64:ff9b::7f00:1", "::a00:1", "::ffff:10.0.0.1", "2002:a00:1::"]
)
def test_an_ipv6_form_wrapping_a_private_ipv4_address_is_not_public(address):
    # NAT64 64:ff9b::/96 is itself globally routable: only the address it wraps tells.
    assert egress.is_forbidden_address(ipaddress.ip_address(address))
