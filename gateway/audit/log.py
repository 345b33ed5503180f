"""The tamper-evident audit log: one HMAC-chained JSON line per response, written off the event
loop. Invariant: `append` returns only once the line is written (and, with fsync "always",
durable); any failure raises `AuditWriteError` and every later append fails too (fail closed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import hmac
import os
import queue
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Final, Literal

import orjson

GENESIS: Final = "0" * 64
RESERVED: Final = frozenset({"seq", "kind", "tag"})
_STOP: Final = object()


class AuditWriteError(Exception):
    """The audit record could not be written; the response must fail closed."""


def mac_key(secret: bytes) -> bytes:
    """Domain-separate the operator's secret so it is never used raw."""
    if len(secret) < 16:
        raise ValueError("the audit key must be at least 16 bytes")
    return hmac.new(secret, b"kvfence audit log v1", hashlib.sha256).digest()


def canonical(entry: dict[str, Any]) -> bytes:
    return orjson.dumps({k: v for k, v in entry.items() if k != "tag"}, option=orjson.OPT_SORT_KEYS)


def chain_tag(key: bytes, prev_tag: str, entry: dict[str, Any]) -> str:
    """tag_i = HMAC(key, tag_{i-1} || canonical(entry_i)); tags are hex."""
    return hmac.new(key, bytes.fromhex(prev_tag) + canonical(entry), hashlib.sha256).hexdigest()


def head_mac(key: bytes, head: dict[str, Any]) -> str:
    body = orjson.dumps({k: v for k, v in head.items() if k != "mac"}, option=orjson.OPT_SORT_KEYS)
    return hmac.new(key, b"head\x00" + body, hashlib.sha256).hexdigest()


def head_path(path: Path) -> Path:
    return path.with_name(path.name + ".head")


def rotated_paths(path: Path) -> list[Path]:
    """Rotated files FILE.1, FILE.2, ... oldest first."""
    found = [p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.suffix[1:]))


class _ChainFile:
    """The active file: its descriptor, chain position and size. Used only by the writer thread."""

    def __init__(self, path: Path, key: bytes) -> None:
        self.path, self.key = path, key
        self.fd = -1
        self.file_id, self.tag, self.seq, self.lines, self.size = "", GENESIS, 0, 0, 0
        prev_file = self._resume()
        if self.fd < 0:
            self._start(prev_file)

    def _resume(self) -> str:
        """Continue an existing file; a torn or unreadable tail is rotated away untouched."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return ""
        data = self.path.read_bytes()
        *complete, rest = data.split(b"\n")
        torn = rest != b""
        try:
            header, last = orjson.loads(complete[0]), orjson.loads(complete[-1])
            self.tag, self.seq = str(last["tag"]), int(last["seq"]) + 1
            bytes.fromhex(self.tag)
        except (IndexError, KeyError, ValueError, TypeError):
            self.tag, self.seq = GENESIS, 0
            self._rotate_away()
            return ""
        if torn or last.get("kind") == "seal":
            self._rotate_away()
            return str(header.get("file_id", ""))
        self.file_id, self.lines, self.size = str(header["file_id"]), len(complete), len(data)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        return ""

    def _rotate_away(self) -> None:
        index = max((int(p.suffix[1:]) for p in rotated_paths(self.path)), default=0) + 1
        os.replace(self.path, self.path.with_name(f"{self.path.name}.{index}"))

    def _start(self, prev_file: str) -> None:
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        self.file_id, self.lines, self.size = secrets.token_hex(16), 0, 0
        self.write({"kind": "header", "v": 1, "file_id": self.file_id, "prev_file_id": prev_file,
                    "prev_tag": self.tag, "created": time.time()})  # fmt: skip

    def write(self, entry: dict[str, Any]) -> None:
        entry = {**entry, "seq": self.seq}
        entry["tag"] = chain_tag(self.key, self.tag, entry)
        line = orjson.dumps(entry, option=orjson.OPT_SORT_KEYS) + b"\n"
        written = os.write(self.fd, line)
        if written != len(line):
            raise OSError(f"short write ({written} of {len(line)} bytes)")
        self.tag, self.seq = entry["tag"], self.seq + 1
        self.lines, self.size = self.lines + 1, self.size + written

    def sync(self) -> None:
        os.fsync(self.fd)
        head = {"file_id": self.file_id, "lines": self.lines, "last_tag": self.tag,
                "time": time.time()}  # fmt: skip
        head["mac"] = head_mac(self.key, head)
        tmp = self.path.with_name(f".{self.path.name}.head.tmp")
        tmp.write_bytes(orjson.dumps(head) + b"\n")
        os.replace(tmp, head_path(self.path))

    def rotate(self) -> None:
        """Seal this file, move it to FILE.N and continue the chain in a fresh FILE."""
        self.write({"kind": "seal", "lines": self.lines + 1})
        self.sync()
        os.close(self.fd)
        self.fd = -1
        prev_file = self.file_id
        self._rotate_away()
        self._start(prev_file)
        self.sync()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class AuditLog:
    """Append-only audit log. fsync "always": each append is durable when it returns (records
    that arrive together share one fsync). "batch": an append returns once written to the OS; a
    crash of the machine loses at most `batch_max_records` records or `batch_max_ms` of them."""

    def __init__(
        self,
        path: Path,
        key: bytes,
        fsync: Literal["always", "batch"] = "always",
        batch_max_records: int = 64,
        batch_max_ms: float = 50.0,
        rotate_bytes: int = 64 << 20,
    ) -> None:
        if fsync not in ("always", "batch") or batch_max_records < 1 or batch_max_ms <= 0:
            raise ValueError("bad fsync policy")
        self.path = Path(path)
        self._fsync, self._max_records, self._max_s = fsync, batch_max_records, batch_max_ms / 1e3
        self._rotate_bytes = rotate_bytes
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failed: str | None = None
        self._lock = threading.Lock()
        try:
            self._file = _ChainFile(self.path, mac_key(key))
            self._file.sync()
        except OSError as exc:
            raise AuditWriteError(f"cannot open audit log {self.path}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)
        self._thread.start()

    async def append(self, record: dict[str, Any]) -> None:
        """Write one record (JSON-serialisable, without the keys seq, kind, tag)."""
        if RESERVED & record.keys():
            raise ValueError(f"audit records may not set {sorted(RESERVED & record.keys())}")
        orjson.dumps(record)  # a record that cannot be encoded is the caller's error, not the log's
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        with self._lock:
            if self._failed is not None:
                raise AuditWriteError(self._failed)
            self._queue.put(({"kind": "record", **record}, future))
        await asyncio.wrap_future(future)

    async def close(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close_sync)

    def close_sync(self) -> None:
        """Write and sync what is queued, then stop; later appends raise AuditWriteError."""
        with self._lock:
            if self._failed is None:
                self._failed = "audit log closed"
                self._queue.put(_STOP)
        self._thread.join()

    def _run(self) -> None:
        unsynced, deadline = 0, 0.0
        while True:
            timeout = max(0.0, deadline - time.monotonic()) if unsynced else None
            try:
                batch = [self._queue.get(timeout=timeout)]
            except queue.Empty:
                batch = []
            while len(batch) < 256 and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            stop = _STOP in batch
            items = [item for item in batch if item is not _STOP]
            try:
                if items and not unsynced:
                    deadline = time.monotonic() + self._max_s
                for entry, _ in items:
                    self._file.write(entry)
                unsynced += len(items)
                if unsynced and (
                    self._fsync == "always"
                    or unsynced >= self._max_records
                    or time.monotonic() >= deadline
                    or stop
                ):
                    self._file.sync()
                    unsynced = 0
                if self._file.size >= self._rotate_bytes:
                    self._file.rotate()
                    unsynced = 0
            except OSError as exc:
                self._fail(f"audit write failed: {exc}", items)
                return
            for _, future in items:
                future.set_result(None)
            if stop:
                self._file.close()
                return

    def _fail(self, reason: str, items: list[tuple[Any, concurrent.futures.Future[None]]]) -> None:
        with self._lock:  # no append can enqueue after this drain
            self._failed = reason
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not _STOP:
                    items.append(item)
        self._file.close()
        for _, future in items:
            future.set_exception(AuditWriteError(reason))
