"""The tamper-evident audit log: one HMAC-chained JSON line per response, written off the event
loop by one thread (the file itself: `chainfile`; the format: `chain`).

Invariant: `append` returns only once the line is written (and, with fsync "always", durable);
any failure raises `AuditWriteError` and every later append fails too (fail closed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import threading
import time
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from gateway.audit.chain.chainfile import ChainFile
from gateway.audit.chain.format import (
    GENESIS,
    RESERVED,
    canonical,
    chain_tag,
    head_mac,
    head_path,
    mac_key,
    rotated_paths,
)
from gateway.audit.chain.lock import AuditLocked, AuditWriteError

_STOP: Final = object()
__all__ = [
    "GENESIS",
    "RESERVED",
    "AuditLocked",
    "AuditLog",
    "AuditWriteError",
    "canonical",
    "chain_tag",
    "head_mac",
    "head_path",
    "mac_key",
    "rotated_paths",
]


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
        anchor: Path | None = None,
    ) -> None:
        """Opens (recovering if need be) the chain at `path`, holding its lock until closed;
        `anchor` is where its anchor is kept, outside the log's folder."""
        if fsync not in ("always", "batch") or batch_max_records < 1 or batch_max_ms <= 0:
            raise ValueError("bad fsync policy")
        self.path = Path(path)
        self._fsync, self._max_records, self._max_s = fsync, batch_max_records, batch_max_ms / 1e3
        self._rotate_bytes = rotate_bytes
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._failed: str | None = None
        self._lock = threading.Lock()
        try:
            self._file = ChainFile(self.path, mac_key(key), anchor)
        except OSError as exc:
            raise AuditWriteError(f"cannot open audit log {self.path}: {exc}") from exc
        try:
            self._file.sync()
        except OSError as exc:
            self._file.close()
            raise AuditWriteError(f"cannot open audit log {self.path}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> str | None:
        """Why this log writes nothing more (it failed, or was closed), or None."""
        return self._failed

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
        # A caller cancelled while its record is queued (its client left) must not cancel the
        # write: the record is written all the same, and the writer thread never meets a future
        # it cannot complete.
        await asyncio.shield(asyncio.wrap_future(future))

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
                if not future.done():
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
            if not future.done():
                future.set_exception(AuditWriteError(reason))
