"""The tamper-evident audit log: one HMAC-chained JSON line per response, written off the event
loop by one thread (the file itself: `chainfile`; the format: `chain`); with a log identity,
also a witnessed log (`transparency`: the Merkle tree and batched signed checkpoints).

Invariant: `append` returns only once the line is written (and, with fsync "always", durable,
unless the caller asked to go on once it is written: then within `batch_max_ms`);
any failure raises `AuditWriteError` and every later append fails too (fail closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from gateway.audit.chain.transparency import LogIdentity, Transparency

_STOP: Final = object()
_CHECKPOINT: Final = object()  # a queued request for a checkpoint now
__all__ = [
    "GENESIS",
    "RESERVED",
    "Appended",
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


@dataclass(frozen=True, slots=True)
class Appended:
    """Where a record landed: its entry's sequence number, which is its leaf's index in a
    witnessed log's tree, and there (else empty) the log's origin, the leaf hash and the line."""

    seq: int
    origin: str = ""
    leaf: bytes = b""
    line: bytes = b""


@dataclass(frozen=True, slots=True)
class _Waiter:
    """Where a caller waits for its item: its event loop and a future there; `written`: the
    caller goes on once its record is written, before the sync that covers it (the next
    caller's who waits for one, which comes before that caller is acknowledged)."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    written: bool = False


def _settle(outcomes: list[tuple[asyncio.Future[Any], Any]]) -> None:
    """On the callers' loop: complete each future (a cancelled caller's is already done)."""
    for future, outcome in outcomes:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _deliver(outcomes: list[tuple[_Waiter, Any]]) -> None:
    """From the writer thread: a whole batch's outcomes in one wake-up per event loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
    for waiter, outcome in outcomes:
        by_loop.setdefault(waiter.loop, []).append((waiter.future, outcome))
    for loop, pairs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there any more
            loop.call_soon_threadsafe(_settle, pairs)


def _behind_the_loop() -> None:
    """The writer thread runs as SCHED_BATCH (Linux): a wake-up of its own (a record queued, a
    sync done) no longer preempts the event loop on a shared core, only for the writer to wait
    there for the GIL the loop holds; it runs when the loop waits, or once the loop's time slice
    ends. Elsewhere, or where the call is refused, it stays as it was."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))


@dataclass(frozen=True, slots=True)
class _Hooked:
    """A record with what to run, on the writer thread, once it is written."""

    entry: dict[str, Any]
    after: Callable[[Appended], None]


class AuditLog:
    """Append-only audit log. fsync "always": each append is durable when it returns, by group
    commit: the writer takes every record queued, writes them, syncs once and only then completes
    them, so one sync covers every record that arrived while the previous one ran; a `written`
    append (returned once written) is synced by the next append's sync, or within
    `batch_max_ms` when none comes. "batch": an
    append returns once written to the OS; a crash of the machine loses at most
    `batch_max_records` records or `batch_max_ms` of them."""

    def __init__(
        self,
        path: Path,
        key: bytes,
        fsync: Literal["always", "batch"] = "always",
        batch_max_records: int = 64,
        batch_max_ms: float = 50.0,
        rotate_bytes: int = 64 << 20,
        anchor: Path | None = None,
        identity: LogIdentity | None = None,
    ) -> None:
        """Opens (recovering if need be) the chain at `path`, holding its lock until closed;
        `anchor` is where its anchor is kept, outside the log's folder; `identity` makes it a
        witnessed log (its tree and signed checkpoints)."""
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
        self._tlog: Transparency | None = None
        try:
            self._file.sync()
            if identity is not None:
                self._tlog = Transparency(self._file, identity)
        except (OSError, ValueError, AuditWriteError) as exc:
            self._file.close()
            if isinstance(exc, AuditWriteError):
                raise
            raise AuditWriteError(f"cannot open audit log {self.path}: {exc}") from exc
        self._thread = threading.Thread(target=self._run, name="audit-log", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> str | None:
        """Why this log writes nothing more (it failed, or was closed), or None."""
        return self._failed

    async def append(
        self,
        record: dict[str, Any],
        after: Callable[[Appended], None] | None = None,
        *,
        written: bool = False,
    ) -> Appended:
        """Write one record (JSON-serialisable, without the keys seq, kind, tag). `after` runs
        on the writer thread once the record is written, with where it landed (the answer's
        receipt is written there: no second hand-off); what it raises, `append` raises.
        `written`: return once the record is written to the OS, without waiting for its sync
        (a stream's `open` record: the stream's final record, synced, covers it)."""
        if RESERVED & record.keys():
            raise ValueError(f"audit records may not set {sorted(RESERVED & record.keys())}")
        orjson.dumps(record)  # a record that cannot be encoded is the caller's error, not the log's
        entry = {"kind": "record", **record}
        item = entry if after is None else _Hooked(entry, after)
        appended: Appended = await self._put(item, written)
        return appended

    @property
    def checkpoints(self) -> int:
        """Checkpoints signed since the log was opened."""
        return self._tlog.made if self._tlog is not None else 0

    async def checkpoint(self) -> str | None:
        """A signed checkpoint of everything appended so far: the current one, or the next
        (at most the checkpoint interval away); None when the log is not a witnessed one."""
        if self._tlog is None:
            return None
        note: str | None = await self._put(_CHECKPOINT)
        return note

    async def _put(self, item: Any, written: bool = False) -> Any:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        with self._lock:
            if self._failed is not None:
                raise AuditWriteError(self._failed)
            self._queue.put((item, _Waiter(loop, future, written)))
        # A caller cancelled while its record is queued (its client left) must not cancel the
        # write: the record is written all the same, and its outcome finds the future done.
        return await asyncio.shield(future)

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
        _behind_the_loop()
        unsynced, deadline, asks = 0, 0.0, []
        unmarked, marked_at = False, 0.0  # synced lines the head does not count yet
        while True:
            batch = self._next(unsynced, deadline, marked_at + self._max_s if unmarked else None)
            stop = _STOP in batch
            items = [item for item in batch if item is not _STOP]
            asks += [waiter for entry, waiter in items if entry is _CHECKPOINT]
            items = [item for item in items if item[0] is not _CHECKPOINT]
            try:
                if items and not unsynced:
                    deadline = time.monotonic() + self._max_s
                results = [self._write(entry) for entry, _ in items]
                outcomes = [(waiter, r) for (_, waiter), r in zip(items, results, strict=True)]
                _deliver([(waiter, r) for waiter, r in outcomes if waiter.written])
                unsynced += len(items)
                # "always" syncs for a caller who waits for it; records whose callers went on
                # once written (a stream's `open`) wait for the next such caller's sync, or at
                # most batch_max_ms: a streamed answer costs one sync, not two.
                durable = any(not waiter.written for _, waiter in items)
                if unsynced and (
                    (self._fsync == "always" and durable)
                    or unsynced >= self._max_records
                    or time.monotonic() >= deadline
                    or stop
                    or asks
                ):
                    self._file.sync_data()
                    unsynced, unmarked = 0, True
            except OSError as exc:
                self._fail(f"audit write failed: {exc}", [*items, *((None, w) for w in asks)])
                return
            # The batch is durable ("always") or written ("batch"): its callers go on now, and
            # the head, the anchor, a checkpoint and a rotation follow off their latency.
            _deliver([(waiter, r) for waiter, r in outcomes if not waiter.written])
            try:
                # The head and the anchor move at most once per batch_max_ms (and at the stop):
                # each is a file replaced by a rename, hundreds of microseconds of the kernel's
                # time, and at one per record it was most of the writer's work. So the
                # checkpoint trails the last durable line by at most batch_max_ms.
                now = time.monotonic()
                if unmarked and (stop or now - marked_at >= self._max_s):
                    self._file.mark()
                    unmarked, marked_at = False, now
                if self._tlog is not None and not unsynced:
                    self._tlog.after_sync(stop)
                if self._file.size >= self._rotate_bytes:
                    self._file.rotate()  # syncs and marks both files
                    unsynced, unmarked = 0, False
            except OSError as exc:
                self._fail(f"audit write failed: {exc}", [(None, w) for w in asks])
                return
            if asks and self._tlog is not None and self._tlog.current:
                _deliver([(waiter, self._tlog.note) for waiter in asks])
                asks = []
            if stop:
                _deliver([(waiter, AuditWriteError("audit log closed")) for waiter in asks])
                self._file.close()
                if self._tlog is not None:
                    self._tlog.close()
                return

    def _next(self, unsynced: int, deadline: float, mark_due: float | None) -> list[Any]:
        """The next batch from the queue, waiting at most until a sync, a move of the head or a
        checkpoint is due."""
        now = time.monotonic()
        waits = [max(0.0, deadline - now)] if unsynced else []
        if mark_due is not None:
            waits.append(max(0.0, mark_due - now))
        due = self._tlog.timeout() if self._tlog is not None else None
        if due is not None:
            waits.append(due)
        try:
            batch = [self._queue.get(timeout=min(waits) if waits else None)]
        except queue.Empty:
            batch = []
        while len(batch) < 256 and not self._queue.empty():
            batch.append(self._queue.get_nowait())
        return batch

    def _write(self, item: dict[str, Any] | _Hooked) -> Appended | Exception:
        entry = item.entry if isinstance(item, _Hooked) else item
        seq = self._file.write(entry)
        tlog = self._tlog
        if tlog is None:
            appended = Appended(seq)
        else:
            appended = Appended(seq, tlog.identity.origin, tlog.last_leaf, tlog.last_line)
        if isinstance(item, _Hooked):
            try:
                item.after(appended)
            except Exception as exc:  # the hook's failure is its caller's, never the log's
                return exc
        return appended

    def _fail(self, reason: str, items: list[tuple[Any, _Waiter]]) -> None:
        with self._lock:  # no append can enqueue after this drain
            self._failed = reason
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if item is not _STOP:
                    items.append(item)
        self._file.close()
        if self._tlog is not None:
            self._tlog.close()
        _deliver([(waiter, AuditWriteError(reason)) for _, waiter in items])
