"""The active audit file as its one writer holds it: an exclusive lock, recovery at start, then
appends, checkpoints (the head beside the log, the anchor elsewhere) and rotation.

Invariant: one process holds each chain (a non-blocking `flock` on `FILE.lock`, released when it
dies). At start an empty or torn active file is recovered, with a `recovery` record saying what
was found; a file cut below its checkpoint, behind its anchor, or under another key is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.audit.chain.anchor import Anchor, AnchorError, read_anchor, write_anchor
from gateway.audit.chain.format import (
    GENESIS,
    chain_tag,
    head_mac,
    head_path,
    key_check,
    rotated_paths,
    sealed,
)
from gateway.audit.chain.lock import AuditWriteError, take_lock

log = logging.getLogger("kvfence.gateway.audit")


@dataclass(frozen=True, slots=True)
class Position:
    """Where a chain stands: its id, the file and the last entry's sequence number and tag."""

    chain: str
    file_id: str
    seq: int
    tag: str


def _entry(path: Path, line: bytes) -> dict[str, Any]:
    try:
        entry = orjson.loads(line)
        if isinstance(entry, dict) and isinstance(entry["seq"], int):
            bytes.fromhex(str(entry["tag"]))
            return entry
    except (orjson.JSONDecodeError, KeyError, ValueError):
        pass
    raise AuditWriteError(f"audit log {path} is corrupt (not a torn tail): keep it as evidence")


def _end_of(path: Path) -> Position:
    """The position a sealed (rotated) file ends at."""
    lines = path.read_bytes().split(b"\n")[:-1]
    if not lines:
        raise AuditWriteError(f"rotated audit file {path} is empty")
    header, last = _entry(path, lines[0]), _entry(path, lines[-1])
    if last.get("kind") != "seal":
        raise AuditWriteError(f"rotated audit file {path} is not sealed")
    return Position(str(header.get("chain", "")), str(header["file_id"]), last["seq"], last["tag"])


class ChainFile:
    """Used only by the audit log's writer thread (and its constructor)."""

    def __init__(self, path: Path, key: bytes, anchor: Path | None = None) -> None:
        self.path, self.key, self.anchor = path, key, anchor
        self.fd, self.chain, self.file_id = -1, "", ""
        self.tag, self.seq, self.lines, self.size = GENESIS, 0, 0, 0
        self._lock_fd = -1
        self.on_line: Callable[[bytes], None] | None = None  # each line as written (the tree)
        self._lock_fd = take_lock(path)
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        rotations = rotated_paths(self.path)
        prev = _end_of(rotations[-1]) if rotations else None
        data = self.path.read_bytes() if self.path.exists() else None
        *complete, torn = data.split(b"\n") if data else [b""]
        if not complete:  # absent, empty, or only part of a header: a crash before any line
            self._check_start(None, [], prev, bool(rotations))
            if data is not None:
                os.truncate(self.path, 0)
            found = None if data is None else ("empty active file" if not data else "torn header")
            return self._start(prev, self._recovery(found, torn) if found else None)
        header, last = _entry(self.path, complete[0]), _entry(self.path, complete[-1])
        if header.get("key_check", key_check(self.key)) != key_check(self.key):
            raise AuditWriteError(f"audit log {self.path} was written under another audit key")
        self._check_start(header, complete, prev, bool(rotations))
        if torn:
            os.truncate(self.path, len(data or b"") - len(torn))
        recovery = self._recovery("torn last line", torn) if torn else None
        here = Position(
            str(header.get("chain", "")), str(header["file_id"]), last["seq"], last["tag"]
        )
        if last.get("kind") == "seal":
            self._rotate_away()
            return self._start(here, recovery)
        self.chain, self.file_id, self.seq, self.tag = (
            here.chain,
            here.file_id,
            here.seq + 1,
            here.tag,
        )
        self.lines, self.size = len(complete), self.path.stat().st_size
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        if recovery is not None:
            self.write(recovery)

    @staticmethod
    def _recovery(found: str, torn: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(torn).hexdigest()
        return {"kind": "recovery", "found": found, "torn_bytes": len(torn), "torn_sha256": digest}

    def _check_start(
        self, header: dict[str, Any] | None, lines: list[bytes], prev: Position | None, old: bool
    ) -> None:
        """Refuse to continue a log cut below its checkpoint or behind its anchor."""
        here = None if header is None else str(header["file_id"])
        head_file, head_lines, head_tag = self._head()
        if head_file is None and (len(lines) > 1 or old):
            raise AuditWriteError(f"audit log {self.path} has lost its checkpoint: keep it")
        if head_file is not None and head_file == here:
            if (
                not 1 <= head_lines <= len(lines)
                or _entry(self.path, lines[head_lines - 1])["tag"] != head_tag
            ):
                raise AuditWriteError(f"audit log {self.path} was cut below its checkpoint")
        elif head_file is not None and (prev is None or head_file != prev.file_id):
            raise AuditWriteError(f"audit log {self.path} is not the file its checkpoint names")
        self._check_anchor(header, lines, prev)

    def _head(self) -> tuple[str | None, int, str]:
        try:
            head = orjson.loads(head_path(self.path).read_bytes())
        except FileNotFoundError:
            return None, 0, ""
        except (OSError, orjson.JSONDecodeError):
            head = None
        if not isinstance(head, dict) or not sealed(self.key, "head", head):
            raise AuditWriteError(f"checkpoint {head_path(self.path)} is forged or corrupt")
        return str(head.get("file_id")), int(head.get("lines", 0)), str(head.get("last_tag"))

    def _check_anchor(
        self, header: dict[str, Any] | None, lines: list[bytes], prev: Position | None
    ) -> None:
        if self.anchor is None:
            return
        try:
            anchor = read_anchor(self.anchor, self.key)
        except AnchorError as exc:
            if not self.anchor.exists() and (header is None and prev is None):
                return  # a new chain
            if not self.anchor.exists():
                log.warning("audit anchor missing: a new one is written", extra={"error": str(exc)})
                return
            raise AuditWriteError(str(exc)) from exc
        if header is not None and anchor.file_id == header["file_id"]:
            index = anchor.seq - int(header["seq"])
            if (
                0 <= index < len(lines)
                and _entry(self.path, lines[index])["tag"] == anchor.last_tag
            ):
                return
        elif prev is not None and (anchor.file_id, anchor.seq, anchor.last_tag) == (
            prev.file_id, prev.seq, prev.tag,
        ):  # fmt: skip
            return
        raise AuditWriteError(
            f"audit log {self.path} is behind its anchor {self.anchor} (seq {anchor.seq}): it "
            "was rolled back, cut or deleted; keep it as evidence"
        )

    def _rotate_away(self) -> None:
        index = max((int(p.suffix[1:]) for p in rotated_paths(self.path)), default=0) + 1
        os.replace(self.path, self.path.with_name(f"{self.path.name}.{index}"))

    def _start(self, prev: Position | None, recovery: dict[str, Any] | None) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.file_id, self.lines, self.size = secrets.token_hex(16), 0, 0
        self.chain = prev.chain if prev is not None and prev.chain else self.file_id
        self.tag, self.seq = (prev.tag, prev.seq + 1) if prev is not None else (GENESIS, 0)
        self.write({"kind": "header", "v": 1, "file_id": self.file_id, "chain": self.chain,
                    "prev_file_id": prev.file_id if prev else "", "prev_tag": self.tag,
                    "key_check": key_check(self.key), "created": time.time()})  # fmt: skip
        if recovery is not None:
            self.write(recovery)

    def write(self, entry: dict[str, Any]) -> int:
        """Append `entry`; returns its sequence number."""
        seq = self.seq
        entry = {**entry, "seq": seq}
        entry["tag"] = chain_tag(self.key, self.tag, entry)
        line = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
        written = os.write(self.fd, line)
        if written != len(line):
            raise OSError(f"short write ({written} of {len(line)} bytes)")
        self.tag, self.seq = entry["tag"], seq + 1
        self.lines, self.size = self.lines + 1, self.size + written
        if self.on_line is not None:
            self.on_line(line[:-1])
        return seq

    def sync(self) -> None:
        """Make the file durable, then move the checkpoint and the anchor up to it."""
        self.sync_data()
        self.mark()

    def sync_data(self) -> None:
        """Make every line written so far durable; OSError when the file was deleted meanwhile
        (its lines would be durable nowhere anyone can read)."""
        os.fsync(self.fd)
        if os.fstat(self.fd).st_nlink == 0:
            raise OSError(f"{self.path} was deleted")

    def mark(self) -> None:
        """Move the checkpoint (the head) and the anchor up to the last line (once synced)."""
        now = time.time()
        head = {"file_id": self.file_id, "lines": self.lines, "last_tag": self.tag, "time": now}
        head["mac"] = head_mac(self.key, head)
        tmp = self.path.with_name(f".{self.path.name}.head.tmp")
        tmp.write_bytes(orjson.dumps(head) + b"\n")
        os.replace(tmp, head_path(self.path))
        if self.anchor is not None:
            at = Anchor(self.chain, self.file_id, self.seq - 1, self.tag, now)
            write_anchor(self.anchor, self.key, at)

    def rotate(self) -> None:
        """Seal this file, move it to FILE.N and continue the chain in a fresh FILE."""
        self.write({"kind": "seal", "lines": self.lines + 1})
        self.sync()
        os.close(self.fd)
        self.fd = -1
        prev = Position(self.chain, self.file_id, self.seq - 1, self.tag)
        self._rotate_away()
        self._start(prev, None)
        self.sync()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the lock
            self._lock_fd = -1
