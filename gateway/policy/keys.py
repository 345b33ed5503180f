"""Reading the policy's key material for kvfence backends and the audit log's settings (with
its checkpoints: the witnessed log's name, key, interval and witnesses).

Invariant: key and trust files are read and parsed once, at load; a file that cannot be used is
a policy error naming the file, the line and the key path, never a failure at request time.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.policy.model import AuditLogSettings, CheckpointSettings, FsyncMode, HandleKey
from gateway.policy.node import Node, optional
from gateway.policy.secrets import SecretRef, read_ref, resolve
from gateway.policy.sources import note
from kvfence.keys.keyfile import KEY_ID_RE, KeyFileError, TrustStore, load_private_key
from kvfence.receipts.note import COSIGNATURE, NoteError, Verifier

_F = frozenset
_AUDIT_REQ: Final = _F({"path", "key"})
_AUDIT_OPT: Final = _F(
    {"fsync", "batch_max_records", "batch_max_ms", "rotate_bytes", "anchor", "checkpoints"}
)
_FILE_ONLY: Final = (
    "must be {file: PATH} (relative to the policy's folder): key material is read from a file"
)
MIN_AUDIT_KEY_BYTES: Final = 16
MAX_HANDLE_TTL_S: Final = 300.0  # the backend's verifier refuses longer lifetimes
_LOG_NAME_RE: Final = re.compile(r"^[A-Za-z0-9._~:/-]{1,200}$")


def _file_ref(node: Node, base: Path) -> tuple[SecretRef, Path]:
    if not isinstance(node.node, yaml.MappingNode):
        node.fail(_FILE_ONLY)
    ref = read_ref(node)
    if ref.source != "file":
        node.fail(_FILE_ONLY)
    return ref, base / ref.name


def read_private_key(node: Node, base: Path) -> tuple[SecretRef, Ed25519PrivateKey]:
    """An Ed25519 private key from `{file: PATH}` (PKCS8 PEM, mode 0600: `kvfence keygen`)."""
    ref, path = _file_ref(node, base)
    note(path)
    try:
        return ref, load_private_key(path)
    except KeyFileError as exc:
        node.fail(str(exc))


def read_handle_key(node: Node, base: Path) -> HandleKey:
    f = node.mapping(_F({"id", "private_key"}), _F())
    key_id = f["id"].text(KEY_ID_RE, "of [A-Za-z0-9._-], at most 64")
    ref, key = read_private_key(f["private_key"], base)
    return HandleKey(key_id, ref, key)


def read_trust(node: Node, base: Path) -> tuple[SecretRef, TrustStore]:
    ref, path = _file_ref(node, base)
    note(path)
    try:
        trust = TrustStore.from_file(path)
    except KeyFileError as exc:
        node.fail(str(exc))
    if not trust:
        node.fail(f"{path}: the trust file lists no keys")
    return ref, trust


def read_handle_ttl(node: Node) -> float:
    ttl = node.positive()
    if ttl > MAX_HANDLE_TTL_S:
        node.fail(f"must be at most {MAX_HANDLE_TTL_S:g} seconds")
    return ttl


def writable_file(node: Node, path: Path) -> Path:
    """`path` must be a file this process can create or append to: its folder exists and is
    writable, and an existing file is a readable and writable regular file."""
    folder = path.parent
    if not folder.is_dir():
        node.fail(f"folder {folder} does not exist: create it (mkdir -m 700) or change the path")
    if not os.access(folder, os.W_OK | os.X_OK):
        node.fail(f"folder {folder} is not writable by this user: fix its owner or mode")
    if path.exists() and not (path.is_file() and os.access(path, os.R_OK | os.W_OK)):
        node.fail(f"{path} exists but is not a file this user can read and write")
    return path


def writable_folder(node: Node, path: Path) -> Path:
    """`path` must be an existing folder this process can create files in."""
    if not path.is_dir():
        node.fail(f"folder {path} does not exist: create it (mkdir -m 700) or change the path")
    if not os.access(path, os.W_OK | os.X_OK):
        node.fail(f"folder {path} is not writable by this user: fix its owner or mode")
    return path


def _anchor(node: Node, path: Path, log_path: Path) -> Path:
    """The anchor must live outside the log's folder: whoever can rewrite the log there must not
    be able to rewrite the anchor too."""
    folder = log_path.parent.resolve()
    if path.parent.resolve() == folder or folder in path.resolve().parents:
        node.fail(f"{path} is inside the log's folder {folder}: put the anchor elsewhere")
    return writable_file(node, path)


def read_audit_log(node: Node, env: Mapping[str, str], base: Path) -> AuditLogSettings:
    f = node.mapping(_AUDIT_REQ, _AUDIT_OPT)
    key = resolve(f["key"], env, base, MIN_AUDIT_KEY_BYTES)
    path = writable_file(f["path"], base / f["path"].text())
    return AuditLogSettings(
        path,
        key,
        **optional(
            f,
            fsync=lambda n: FsyncMode(n.choice(("always", "batch"))),
            batch_max_ms=Node.positive,
            batch_max_records=lambda n: n.integer(1, 1 << 20),
            rotate_bytes=lambda n: n.integer(4096, 1 << 40),
            anchor=lambda n: _anchor(n, base / n.text(), path),
            checkpoints=lambda n: read_checkpoints(n, base),
        ),
    )


def read_checkpoints(node: Node, base: Path) -> CheckpointSettings:
    f = node.mapping(_F({"name", "key"}), _F({"interval_s", "witnesses"}))
    name = f["name"].text(_LOG_NAME_RE, "a key name such as example.com/kvfence (no spaces or +)")
    ref, key = read_private_key(f["key"], base)
    witnesses = []
    for item in f["witnesses"].items() if "witnesses" in f else []:
        try:
            witness = Verifier.parse(item.text())
        except NoteError as exc:
            item.fail(str(exc))
        if witness.kind != COSIGNATURE:
            item.fail("a witness's key is a cosignature key (type 0x04): `kvfence witness keygen`")
        witnesses.append(witness.vkey)
    return CheckpointSettings(
        name,
        ref,
        key,
        witnesses=tuple(witnesses),
        **optional(f, interval_s=lambda n: n.number(0.05, 3600.0)),
    )
