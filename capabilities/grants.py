"""Credential grants: where a credential may be sent, to which steps, for which automations.

A credential is a permission, not only a secret. Operators may use credentials in steps but
not manage them, so what a step can do with one is decided by those who manage credentials,
on the credential itself (SPEC §5.2, issue 12):

- ``allowed_destinations``: hosts (``api.example.com``, ``*.example.com`` for subdomains,
  ``host:8443`` for one port) or URL prefixes (``https://api.example.com/v1/``: scheme,
  host and port equal, path under the prefix once both are normalised as a server reads
  them: ``%2e%2e`` and ``..;`` resolved, ``//`` collapsed; an encoded ``/`` or ``\\``
  matches no prefix). ``http_request`` sends the credential only
  there; any other destination fails the step with ``POLICY_VIOLATION``, and a redirect
  hop outside them goes on without the credential. Empty (the default): nowhere.
- ``allow_code_steps``: whether ``run_python``/``run_shell`` may receive it in their
  environment. Off by default: code can encode a secret however it likes, so no redaction
  can keep a code step from printing it.
- ``allowed_automations``: ``None`` (the default) for every automation of the workspace,
  or a list of automation ids.

The checks run at save (the definition is refused with ``credential_not_granted`` when a
literal reference breaks a grant) and again at every use, since a templated URL is only
known then and grants can change after a save.

Pure: no Django.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

MAX_DESTINATIONS = 50
MAX_AUTOMATIONS = 1000
_DEFAULT_PORTS = {"http": 80, "https": 443}


class GrantError(ValueError):
    """An invalid grant; ``path`` points into the credential's fields."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


@dataclass(frozen=True)
class Grant:
    allowed_destinations: tuple[str, ...] = ()
    allow_code_steps: bool = False
    allowed_automations: frozenset[str] | None = None  # None: every automation

    def allows_automation(self, automation_id: Any) -> bool:
        return self.allowed_automations is None or str(automation_id) in self.allowed_automations

    def allows_destination(self, url: str) -> bool:
        return any(_matches(entry, url) for entry in self.allowed_destinations)


_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")
_HEX = frozenset("0123456789abcdefABCDEF")


def normalise_path(path: str) -> str | None:
    """``path`` as a server resolves it, for comparing with a grant's prefix; None when it is
    ambiguous and matches no prefix.

    Percent-encoded unreserved characters are decoded (``%2e`` is ``.``, other escapes keep
    their octets, upper-cased), runs of ``/`` collapse, and dot segments are resolved (RFC
    3986 5.2.4), a segment whose part before ``;`` is a dot segment counting as one
    (``..;/``, as some servers read it). An encoded slash or backslash (``%2f``, ``%5c``), a
    literal backslash, a broken escape or an encoded NUL make the path ambiguous: servers
    disagree on them.
    """
    out: list[str] = []
    i = 0
    while i < len(path):
        char = path[i]
        if char == "%":
            code = path[i + 1 : i + 3]
            if len(code) != 2 or not set(code) <= _HEX:
                return None
            decoded = chr(int(code, 16))
            if decoded in "/\\\0":
                return None
            out.append(decoded if decoded in _UNRESERVED else "%" + code.upper())
            i += 3
            continue
        if char == "\\":
            return None
        out.append(char)
        i += 1
    segments: list[str] = []
    parts = "".join(out).split("/")
    for index, segment in enumerate(parts):
        last = index == len(parts) - 1
        dots = segment.split(";", 1)[0]
        if dots == "..":
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif dots == ".":
            if last:
                segments.append("")
        elif segment or last:
            segments.append(segment)
    return "/" + "/".join(segments)


def _split(url: str) -> tuple[str, str, int | None, str] | None:
    """(scheme, host, port, normalised path) of an absolute http(s) URL; None if it is not one
    (or its path is ambiguous, see :func:`normalise_path`)."""
    try:
        parts = urlsplit(url.strip())
        scheme, host, port = parts.scheme.lower(), (parts.hostname or "").lower().rstrip("."), parts.port
    except ValueError:
        return None
    if scheme not in _DEFAULT_PORTS or not host:
        return None
    path = normalise_path(parts.path or "/")
    if path is None:
        return None
    return scheme, host, port or _DEFAULT_PORTS[scheme], path


def _under(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or lies below it, segment-wise (``/v1`` covers ``/v1/x``, not ``/v1x``)."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix[:-1]
    return path == prefix or path.startswith(prefix + "/")


def _matches(entry: str, url: str) -> bool:
    target = _split(url)
    if target is None:
        return False
    scheme, host, port, path = target
    if "://" in entry:  # a URL prefix
        prefix = _split(entry)
        if prefix is None:
            return False
        return (prefix[0], prefix[1], prefix[2]) == (scheme, host, port) and _under(path, prefix[3])
    name, _, wanted_port = entry.lower().partition(":")
    if wanted_port and int(wanted_port) != port:
        return False
    if name.startswith("*."):
        return host.endswith(name[1:])
    return host == name


def check_destinations(value: Any) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_DESTINATIONS:
        raise GrantError(f"allowed_destinations must be a list of at most {MAX_DESTINATIONS} hosts or URL "
                         "prefixes", "/allowed_destinations")  # fmt: skip
    clean = []
    for i, entry in enumerate(value):
        if not isinstance(entry, str) or not 1 <= len(entry) <= 500 or not _valid_entry(entry):
            raise GrantError(
                "each destination is a host (api.example.com, *.example.com, host:8443) or an http(s) URL "
                "prefix (https://api.example.com/v1/)",
                f"/allowed_destinations/{i}",
            )
        clean.append(entry.strip())
    return clean


def _valid_entry(entry: str) -> bool:
    if "://" in entry:
        return _split(entry) is not None
    name, _, port = entry.strip().partition(":")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        return False
    name = name.removeprefix("*.")
    labels = name.split(".")
    return bool(name) and all(
        0 < len(label) < 64 and all(c.isascii() and (c.isalnum() or c == "-") for c in label)
        for label in labels
    )


def check_automations(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_AUTOMATIONS:
        raise GrantError(f"allowed_automations is null (every automation) or a list of at most {MAX_AUTOMATIONS} "
                         "automation ids", "/allowed_automations")  # fmt: skip
    clean = []
    for i, item in enumerate(value):
        try:
            clean.append(str(uuid.UUID(str(item))))
        except ValueError:
            raise GrantError("not an automation id", f"/allowed_automations/{i}") from None
    return sorted(set(clean))
