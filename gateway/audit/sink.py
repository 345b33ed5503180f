"""The open audit log of the running policy: opened once, kept across reloads whose audit log
settings are unchanged, reopened when they change (the old one closed first: it holds its
chain's lock), and reopened after it failed (a full disk, say), at most every `RETRY_S`.

Invariant: a record is written to the log of the policy snapshot its request was served under;
a log that cannot be opened or written fails the request closed, and a log that failed counts
as writable again only once a record saying it resumed (`audit_resumed`) is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Final

from aiohttp import web

from gateway.audit.chain.format import worker_path
from gateway.audit.chain.log import Appended, AuditLog, AuditWriteError
from gateway.audit.chain.transparency import LogIdentity
from gateway.policy.model import AuditLogSettings, CheckpointSettings
from kvfence.receipts.note import ED25519, Signer

log = logging.getLogger("kvfence.gateway.audit")
_UNSET = object()
RETRY_S: Final = 1.0  # how often a failed log is reopened
__all__ = [
    "AUDIT_SINK",
    "AuditSink",
    "audit_sink_ctx",
    "log_identity",
    "log_signer",
    "open_log",
    "worker_path",
]


def log_signer(checkpoints: CheckpointSettings) -> Signer:
    """The note signer of the log's checkpoints (its key's name is the log's name)."""
    return Signer(checkpoints.name, ED25519, checkpoints.key)


def log_identity(settings: AuditLogSettings, worker: int | None = None) -> LogIdentity | None:
    """Who signs this worker's chain's checkpoints, under which origin (NAME, or NAME/wK)."""
    checkpoints = settings.checkpoints
    if checkpoints is None:
        return None
    origin = checkpoints.name if worker is None else f"{checkpoints.name}/w{worker}"
    return LogIdentity(origin, log_signer(checkpoints), checkpoints.interval_s)


def open_log(settings: AuditLogSettings, worker: int | None = None) -> AuditLog:
    """Blocking: creates or resumes the file."""
    return AuditLog(
        worker_path(settings.path, worker),
        settings.key.value,
        fsync=settings.fsync.value,
        batch_max_records=settings.batch_max_records,
        batch_max_ms=settings.batch_max_ms,
        rotate_bytes=settings.rotate_bytes,
        anchor=None if settings.anchor is None else worker_path(settings.anchor, worker),
        identity=log_identity(settings, worker),
    )


class AuditSink:
    """Holds the current `AuditLog` (or none) for the app."""

    def __init__(self, settings: AuditLogSettings | None, worker: int | None = None) -> None:
        self._settings: object = settings  # _UNSET while no log matches any settings
        self._worker = worker
        self._log = open_log(settings, worker) if settings is not None else None
        self._lock = asyncio.Lock()
        self._retry_at = 0.0
        self._closed = False

    async def _current(self, settings: AuditLogSettings | None) -> AuditLog | None:
        if settings == self._settings and not self._lock.locked():
            if self._log is not None and self._log.failed is not None and settings is not None:
                await self._resume(settings)
            return self._log
        async with self._lock:  # callers wait while a log is switched
            if settings != self._settings:
                old, self._log, self._settings = self._log, None, _UNSET
                if old is not None:  # its queued records are written before it closes
                    await old.close()
                if settings is not None:  # a failure leaves _UNSET: the next call retries
                    self._log = await asyncio.to_thread(open_log, settings, self._worker)
                self._settings = settings
            return self._log

    async def _resume(self, settings: AuditLogSettings) -> None:
        """Reopen a log that failed (recovered as at a start), at most every `RETRY_S`."""
        now = time.monotonic()
        if self._closed or now < self._retry_at:
            return
        self._retry_at = now + RETRY_S
        async with self._lock:
            old = self._log
            if old is None or old.failed is None or settings != self._settings:
                return
            await old.close()
            try:
                new = await asyncio.to_thread(open_log, settings, self._worker)
            except AuditWriteError as exc:
                log.error("audit log still cannot be written", extra={"error": str(exc)})
                return
            self._log = new
            with contextlib.suppress(AuditWriteError):
                await new.append({"event": "audit_resumed", "after": old.failed,
                                  "time": round(time.time(), 3)})  # fmt: skip
                log.warning("audit log resumed", extra={"after": old.failed})

    async def unwritable(self, settings: AuditLogSettings | None) -> str | None:
        """Why no record can be written now (once a failed log was tried again), or None."""
        if settings is None:
            return None
        try:
            current = await self._current(settings)
        except (AuditWriteError, OSError) as exc:
            return str(exc)
        return "the audit log is not open" if current is None else current.failed

    async def append(
        self,
        settings: AuditLogSettings | None,
        record: dict[str, Any],
        after: Callable[[Appended], None] | None = None,
        *,
        written: bool = False,
    ) -> Appended | None:
        """Write `record` to the log `settings` name: where it landed, or None when no log is
        configured (`after` then never runs); `after` runs once it is written, and `written`
        returns before the record's sync (AuditLog.append).
        Raises `AuditWriteError` when it cannot be written, or what `after` raised."""
        try:
            current = await self._current(settings)
        except (AuditWriteError, OSError) as exc:
            log.error("audit log cannot be opened", extra={"error": str(exc)})
            raise AuditWriteError(str(exc)) from exc
        if settings is None:
            return None
        if current is None:
            raise AuditWriteError(f"audit log {settings.path} is not open")
        return await current.append(record, after, written=written)

    async def event(self, settings: AuditLogSettings | None, record: dict[str, Any]) -> None:
        """Write a record of something other than an answer (a quarantine transition). A failure
        is not raised: nothing waits on this record, and a log that cannot be written fails the
        next answer's record closed (counted there)."""
        with contextlib.suppress(AuditWriteError):
            await self.append(settings, record)

    @property
    def worker(self) -> int | None:
        return self._worker

    @property
    def checkpoints(self) -> int:
        """Checkpoints the open log signed since it was opened."""
        return self._log.checkpoints if self._log is not None else 0

    async def checkpoint(self, settings: AuditLogSettings | None) -> str | None:
        """A signed checkpoint of this worker's chain now (None: no witnessed log)."""
        current = await self._current(settings)
        return None if current is None else await current.checkpoint()

    async def close(self) -> None:
        self._closed = True
        if self._log is not None:
            await self._log.close()


AUDIT_SINK = web.AppKey("kvfence_audit_sink", AuditSink)


async def audit_sink_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[AUDIT_SINK].close()
