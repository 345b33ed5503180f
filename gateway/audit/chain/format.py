"""The audit chain's format, shared by the writer and the verifier: keys, tags, the key check
value, the checkpoint and anchor MACs, and the names of a log's companion files.

Invariant: every tag and MAC is an HMAC under a key derived from the operator's secret with its
own domain tag, so no value of one kind can stand in for another.
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any, Final

import orjson

GENESIS: Final = "0" * 64
KINDS: Final = frozenset({"header", "record", "recovery", "seal"})
RESERVED: Final = frozenset({"seq", "kind", "tag"})


def mac_key(secret: bytes) -> bytes:
    """Domain-separate the operator's secret so it is never used raw."""
    if len(secret) < 16:
        raise ValueError("the audit key must be at least 16 bytes")
    return hmac.new(secret, b"kvfence audit log v1", hashlib.sha256).digest()


def key_check(key: bytes) -> str:
    """A value in each file's header that tells a wrong key from tampering: it reveals nothing
    about the key, and it matches only under the key the file was written with."""
    return hmac.new(key, b"kvfence audit key check", hashlib.sha256).hexdigest()[:32]


def canonical(entry: dict[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in entry.items() if k != "tag"}, option=orjson.OPT_SORT_KEYS)


def chain_tag(key: bytes, prev_tag: str, entry: dict[str, Any]) -> str:
    """tag_i = HMAC(key, tag_{i-1} || canonical(entry_i)); tags are hex."""
    return hmac.new(key, bytes.fromhex(prev_tag) + canonical(entry), hashlib.sha256).hexdigest()


def _mac(key: bytes, domain: bytes, doc: dict[str, Any]) -> str:
    body = orjson.dumps({k: v for k, v in doc.items() if k != "mac"}, option=orjson.OPT_SORT_KEYS)
    return hmac.new(key, domain + b"\x00" + body, hashlib.sha256).hexdigest()


def head_mac(key: bytes, head: dict[str, Any]) -> str:
    return _mac(key, b"head", head)


def anchor_mac(key: bytes, anchor: dict[str, Any]) -> str:
    return _mac(key, b"anchor", anchor)


def sealed(key: bytes, domain: str, doc: dict[str, Any]) -> bool:
    """Whether `doc` carries a valid MAC of its `domain` ("head" or "anchor")."""
    expected = head_mac(key, doc) if domain == "head" else anchor_mac(key, doc)
    return hmac.compare_digest(str(doc.get("mac")), expected)


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def lock_path(path: Path) -> Path:
    return path.with_name(path.name + ".lock")


def rotated_paths(path: Path) -> list[Path]:
    """Rotated files FILE.1, FILE.2, ... oldest first."""
    found = [p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.suffix[1:]))


def worker_path(path: Path, worker: int | None) -> Path:
    """Each worker process of one gateway keeps its own chain (and anchor): `audit.jsonl` ->
    `audit.w2.jsonl`."""
    if worker is None:
        return path
    return path.with_name(f"{path.stem}.w{worker}{path.suffix}")
