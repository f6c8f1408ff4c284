"""The platform's Ed25519 signing key: audit checkpoints now, approval tokens later.

Where the key comes from, in order:

1. ``AUTOPLANE_SIGNING_KEY``: PEM text (PKCS#8) or base64 of the 32 raw private bytes;
2. the key file ``AUTOPLANE_SIGNING_KEY_FILE`` (default ``DATA_DIR/signing_key.pem``);
3. in the embedded default (SQLite) only, a key file generated on first use with
   mode 0600. With PostgreSQL a missing key is a configuration error: several
   containers would otherwise each invent their own key. ``manage.py keygen``
   writes the file explicitly. The setting ``AUTOPLANE_SIGNING_KEY_AUTOGENERATE``
   (optional) overrides that choice.

The key is never stored in the database. ``key_id`` is the first 16 hex digits of
sha256 over the raw public key. Retired public keys (``AUTOPLANE_RETIRED_PUBLIC_KEY_FILES``
plus any ``*.pem`` in ``<key file dir>/retired_keys/``, where ``keygen --rotate`` puts
them) keep old signatures verifiable after a rotation.

Callers sign *domain-separated* bytes (checkpoints begin their canonical JSON with
a ``"kind"`` field; approval tokens should do the same), so a signature made for
one purpose can never be replayed as another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

logger = logging.getLogger(__name__)

ALGORITHM = "Ed25519"
RETIRED_DIR_NAME = "retired_keys"


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    text = text.strip()
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_for(public_key: Ed25519PublicKey) -> str:
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


def private_pem(private_key: Ed25519PrivateKey) -> bytes:
    return private_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@dataclass(frozen=True)
class _Keyring:
    private_key: Ed25519PrivateKey
    key_id: str
    # key_id -> (public key, is current)
    public: dict[str, tuple[Ed25519PublicKey, bool]]


_lock = threading.Lock()
_cache: dict[tuple, _Keyring] = {}


def _parse_private_key(text: str, source: str) -> Ed25519PrivateKey:
    text = text.strip()
    try:
        if text.startswith("-----BEGIN"):
            key = serialization.load_pem_private_key(text.encode(), password=None)
        else:
            raw = base64.b64decode(
                text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True
            )
            if len(raw) != 32:
                raise ValueError("expected 32 raw bytes")
            key = Ed25519PrivateKey.from_private_bytes(raw)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise ImproperlyConfigured(f"{source} is not an Ed25519 private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ImproperlyConfigured(f"{source} is not an Ed25519 private key")
    return key


def _parse_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ImproperlyConfigured(f"retired public key {path} cannot be read ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ImproperlyConfigured(f"retired public key {path} is not an Ed25519 key")
    return key


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _retired_paths() -> list[Path]:
    paths = [Path(p) for p in settings.AUTOPLANE_RETIRED_PUBLIC_KEY_FILES]
    retired_dir = Path(settings.AUTOPLANE_SIGNING_KEY_FILE).parent / RETIRED_DIR_NAME
    if retired_dir.is_dir():
        paths.extend(sorted(retired_dir.glob("*.pem")))
    return paths


def _autogenerate() -> bool:
    return bool(settings.AUTOPLANE_SIGNING_KEY_AUTOGENERATE)


def generate_key_file(path: Path | str, force: bool = False) -> Ed25519PrivateKey:
    """Write a new private key (PEM, mode 0600) to ``path`` and return it.

    Refuses to replace an existing file unless ``force``. The file appears
    atomically, so two processes racing to create it end up sharing one key.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    fd, tmp = tempfile.mkstemp(prefix=".signing-key-", dir=path.parent)  # mkstemp creates it 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(private_pem(key))
            fh.flush()
            os.fsync(fh.fileno())
        if force:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)  # fails if the file exists: never overwrite silently
            except FileExistsError:
                raise FileExistsError(f"{path} already exists (use force to replace it)") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return key


def read_key_file(path: Path | str) -> Ed25519PrivateKey:
    """The private key in ``path`` (PEM or base64 of the raw bytes); ImproperlyConfigured if unusable."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ImproperlyConfigured(f"signing key file {path} cannot be read ({exc})") from None
    return _parse_private_key(text, f"signing key file {path}")


def _load_private_key() -> Ed25519PrivateKey:
    if settings.AUTOPLANE_SIGNING_KEY:
        return _parse_private_key(settings.AUTOPLANE_SIGNING_KEY, "AUTOPLANE_SIGNING_KEY")
    path = Path(settings.AUTOPLANE_SIGNING_KEY_FILE)
    if not path.exists():
        if not _autogenerate():
            raise ImproperlyConfigured(
                f"no signing key: set AUTOPLANE_SIGNING_KEY or run `manage.py keygen` to create {path}"
            )
        try:
            generate_key_file(path)
            logger.warning("generated a new audit/approval signing key at %s", path)
        except FileExistsError:
            pass  # another process created it first; use theirs
    return read_key_file(path)


def _config_state() -> tuple:
    key_file = Path(settings.AUTOPLANE_SIGNING_KEY_FILE)
    return (
        settings.AUTOPLANE_SIGNING_KEY,
        str(key_file),
        None if settings.AUTOPLANE_SIGNING_KEY else _mtime(key_file),
        tuple((str(p), _mtime(p)) for p in _retired_paths()),
    )


def _keyring() -> _Keyring:
    # Cached per configuration and file modification times, so a rotated key file
    # (or a setting overridden in tests) takes effect without a restart.
    ring = _cache.get(_config_state())
    if ring is not None:
        return ring
    with _lock:
        private_key = _load_private_key()
        current_id = key_id_for(private_key.public_key())
        public: dict[str, tuple[Ed25519PublicKey, bool]] = {}
        for path in _retired_paths():
            retired_key = _parse_public_key(path)
            public[key_id_for(retired_key)] = (retired_key, False)
        public[current_id] = (private_key.public_key(), True)
        ring = _Keyring(private_key=private_key, key_id=current_id, public=public)
        _cache.clear()
        _cache[_config_state()] = ring  # after loading: a generated file has an mtime now
    return ring


def signing_key() -> Ed25519PrivateKey:
    """The current private key (cached)."""
    return _keyring().private_key


def current_key_id() -> str:
    return _keyring().key_id


def sign(data: bytes) -> tuple[str, str]:
    """Sign ``data`` with the current key; return ``(key_id, base64url signature)``."""
    ring = _keyring()
    return ring.key_id, b64url(ring.private_key.sign(data))


def verify(key_id: str, data: bytes, signature: str) -> bool:
    """True when ``signature`` over ``data`` was made by the current or a retired key named ``key_id``."""
    entry = _keyring().public.get(str(key_id))
    if entry is None:
        return False
    try:
        entry[0].verify(b64url_decode(str(signature)), data)
    except (InvalidSignature, ValueError, binascii.Error):
        return False
    return True


def is_current(key_id: str) -> bool:
    """True when ``key_id`` names the key that signs now (not a retired one). What a signature
    *authorises* (approval tokens, standing approvals) must be by the current key: retired keys
    only prove what was signed before the rotation (checkpoints, anchors)."""
    entry = _keyring().public.get(str(key_id))
    return entry is not None and entry[1]


def public_keys() -> list[dict[str, Any]]:
    """Every key that can verify: the current one first, then retired ones."""
    ring = _keyring()
    entries = sorted(ring.public.items(), key=lambda item: (not item[1][1], item[0]))
    return [
        {
            "key_id": key_id,
            "algorithm": ALGORITHM,
            "public_key": b64url(raw_public_bytes(public_key)),
            "pem": public_pem(public_key),
            "current": current,
        }
        for key_id, (public_key, current) in entries
    ]


def retire_public_key(public_key: Ed25519PublicKey, key_file: Path | str) -> Path:
    """Write ``public_key`` where the keyring finds retired keys (``<key dir>/retired_keys/<key_id>.pem``)."""
    retired_dir = Path(key_file).parent / RETIRED_DIR_NAME
    retired_dir.mkdir(parents=True, exist_ok=True)
    path = retired_dir / f"{key_id_for(public_key)}.pem"
    path.write_text(public_pem(public_key))
    return path
