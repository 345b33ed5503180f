"""The chain's anchor: a MACed copy of the chain's position (chain id, file, sequence number,
tag) kept outside the log's folder, rewritten at every checkpoint. Whoever can write the log's
folder but not the anchor's cannot roll the log back or delete its files unnoticed.

Invariant: `read_anchor` returns only an anchor whose MAC verifies under the key; a missing,
unreadable or forged anchor raises `AnchorError`.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from gateway.audit.chain.format import anchor_mac, sealed


class AnchorError(Exception):
    """The anchor is missing, unreadable or not valid under the key."""


@dataclass(frozen=True, slots=True)
class Anchor:
    chain: str  # the chain's id: the file id of its first file
    file_id: str  # the file that held the anchored entry
    seq: int  # the anchored entry's sequence number (counted across the whole chain)
    last_tag: str  # its tag
    time: float


def write_anchor(path: Path, key: bytes, anchor: Anchor) -> None:
    """Replace the anchor atomically (a temporary file in the same folder, then a rename)."""
    doc: dict[str, object] = {"v": 1, **asdict(anchor)}
    doc["mac"] = anchor_mac(key, doc)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(orjson.dumps(doc) + b"\n")
    os.replace(tmp, path)


def read_anchor(path: Path, key: bytes) -> Anchor:
    try:
        doc = orjson.loads(path.read_bytes())
    except FileNotFoundError as exc:
        raise AnchorError(f"anchor {path} is missing") from exc
    except (OSError, orjson.JSONDecodeError) as exc:
        raise AnchorError(f"anchor {path} is unreadable") from exc
    if not isinstance(doc, dict) or not sealed(key, "anchor", doc):
        raise AnchorError(f"anchor {path} is forged, corrupt or under another key")
    try:
        return Anchor(
            str(doc["chain"]),
            str(doc["file_id"]),
            int(doc["seq"]),
            str(doc["last_tag"]),
            float(doc["time"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise AnchorError(f"anchor {path} is malformed") from exc
