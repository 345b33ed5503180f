"""Ed25519 key files and trust files: private keys as PKCS8 PEM (mode 0600), public keys as
`{"keys": [{"id": ..., "public_key": <base64url raw 32 bytes>}]}`.

Invariant: a private key is never read from a file that group or others can access, and every
loader either returns valid keys or raises `KeyFileError` naming the file and the problem.
"""

from __future__ import annotations

import base64
import os
import re
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

KEY_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")
_MAX_FILE_BYTES = 1 << 20


class KeyFileError(Exception):
    """A key or trust file is missing, unreadable, badly formed or too permissive."""


def check_key_id(key_id: str) -> str:
    if not isinstance(key_id, str) or not KEY_ID_RE.fullmatch(key_id):
        raise KeyFileError(f"key id {key_id!r} must be 1-64 characters of A-Z a-z 0-9 . _ -")
    return key_id


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url without padding: exactly one text per byte string, or ValueError."""
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if b64url(raw) != text:
        raise ValueError("not canonical base64url")
    return raw


def generate_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return b64url(raw)


def parse_public_key(text: str) -> Ed25519PublicKey:
    try:
        raw = b64url_decode(text)
    except (ValueError, TypeError) as exc:
        raise KeyFileError("public_key is not base64url") from exc
    if len(raw) != 32:
        raise KeyFileError(f"public_key has {len(raw)} bytes, an Ed25519 key has 32")
    return Ed25519PublicKey.from_public_bytes(raw)


def write_private_key(path: Path, key: Ed25519PrivateKey, *, overwrite: bool = False) -> None:
    """Write PKCS8 PEM, created with mode 0600 (never briefly wider)."""
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError as exc:
        raise KeyFileError(f"{path}: already exists; refusing to overwrite a key") from exc
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(pem)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """Load an Ed25519 PKCS8 PEM key; refuse a file that group or others may access."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & 0o077:
                raise KeyFileError(
                    f"{path}: private key is accessible by group/others "
                    f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}"
                )
            data = fh.read(_MAX_FILE_BYTES)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read private key ({exc.strerror})") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path}: not an unencrypted PKCS8 PEM private key") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path}: private key is not Ed25519")
    return key


def trust_entry(key_id: str, key: Ed25519PublicKey) -> dict[str, str]:
    return {"id": check_key_id(key_id), "public_key": public_key_text(key)}


class TrustStore(Mapping[str, Ed25519PublicKey]):
    """Key id -> public key, parsed once; lookups on the verification path are a dict get."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Mapping[str, Ed25519PublicKey]) -> None:
        for key_id in keys:
            check_key_id(key_id)
        self._keys = dict(keys)

    def __getitem__(self, key_id: str) -> Ed25519PublicKey:
        return self._keys[key_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"TrustStore({sorted(self._keys)})"

    @classmethod
    def from_file(cls, path: Path) -> TrustStore:
        return cls(_parse_entries(path, _read_document(path)))


def _read_document(path: Path) -> Any:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot read trust file ({exc.strerror})") from exc
    if len(data) > _MAX_FILE_BYTES:
        raise KeyFileError(f"{path}: trust file is larger than 1 MiB")
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise KeyFileError(f"{path}: not valid JSON or YAML ({exc})") from exc


def _parse_entries(path: Path, doc: Any) -> dict[str, Ed25519PublicKey]:
    if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
        raise KeyFileError(f'{path}: expected a mapping with a "keys" list')
    keys: dict[str, Ed25519PublicKey] = {}
    for index, entry in enumerate(doc["keys"]):
        where = f"{path}: keys[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"id", "public_key"}:
            raise KeyFileError(f'{where}: expected exactly the fields "id" and "public_key"')
        try:
            key_id = check_key_id(entry["id"])
            if not isinstance(entry["public_key"], str):
                raise KeyFileError("public_key must be a string")
            key = parse_public_key(entry["public_key"])
        except KeyFileError as exc:
            raise KeyFileError(f"{where}: {exc}") from None
        if key_id in keys:
            raise KeyFileError(f"{where}: duplicate key id {key_id!r}")
        keys[key_id] = key
    return keys


def write_trust_file(path: Path, entries: list[dict[str, str]]) -> None:
    """Atomically replace `path` with a trust file holding `entries`."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps({"keys": entries}, option=orjson.OPT_INDENT_2) + b"\n")
    os.replace(tmp, path)


def add_to_trust_file(path: Path, key_id: str, key: Ed25519PublicKey) -> bool:
    """Add one entry, creating the file if needed. Returns False when it was already there;
    raises when the id is present with a different key."""
    entry = trust_entry(key_id, key)
    existing = TrustStore.from_file(path) if path.exists() else TrustStore({})
    if key_id in existing:
        if public_key_text(existing[key_id]) != entry["public_key"]:
            raise KeyFileError(f"{path}: key id {key_id!r} is already trusted with another key")
        return False
    entries = [trust_entry(kid, pub) for kid, pub in existing.items()]
    write_trust_file(path, [*entries, entry])
    return True
