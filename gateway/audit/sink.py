"""The open audit log of the running policy: opened once, kept across reloads whose audit log
settings are unchanged, reopened (and the old one closed) when they change.

Invariant: a record is written to the log of the policy snapshot its request was served under;
a log that cannot be opened or written fails the request closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.audit.log import AuditLog, AuditWriteError
from gateway.policy.model import AuditLogSettings

log = logging.getLogger("kvfence.gateway.audit")


def worker_path(path: Path, worker: int | None) -> Path:
    """Each worker process of one gateway keeps its own chain: `audit.jsonl` -> `audit.w2.jsonl`."""
    if worker is None:
        return path
    return path.with_name(f"{path.stem}.w{worker}{path.suffix}")


def open_log(settings: AuditLogSettings, worker: int | None = None) -> AuditLog:
    """Blocking: creates or resumes the file."""
    return AuditLog(
        worker_path(settings.path, worker),
        settings.key.value,
        fsync=settings.fsync.value,
        batch_max_records=settings.batch_max_records,
        batch_max_ms=settings.batch_max_ms,
        rotate_bytes=settings.rotate_bytes,
    )


class AuditSink:
    """Holds the current `AuditLog` (or none) for the app."""

    def __init__(self, settings: AuditLogSettings | None, worker: int | None = None) -> None:
        self._settings = settings
        self._worker = worker
        self._log = open_log(settings, worker) if settings is not None else None
        self._lock = asyncio.Lock()
        self._closing: set[asyncio.Task[None]] = set()

    async def _current(self, settings: AuditLogSettings | None) -> AuditLog | None:
        if settings == self._settings:
            return self._log
        async with self._lock:
            if settings != self._settings:
                old = self._log
                self._log = (
                    None
                    if settings is None
                    else await asyncio.to_thread(open_log, settings, self._worker)
                )
                self._settings = settings
                if old is not None:
                    task = asyncio.create_task(old.close())
                    self._closing.add(task)
                    task.add_done_callback(self._closing.discard)
            return self._log

    async def append(self, settings: AuditLogSettings | None, record: dict[str, Any]) -> bool:
        """Write `record` to the log `settings` name; False when no log is configured. Raises
        `AuditWriteError` when it cannot be written."""
        try:
            current = await self._current(settings)
        except (AuditWriteError, OSError) as exc:
            log.error("audit log cannot be opened", extra={"error": str(exc)})
            raise AuditWriteError(str(exc)) from exc
        if current is None:
            return False
        await current.append(record)
        return True

    async def close(self) -> None:
        if self._closing:
            await asyncio.gather(*self._closing)
        if self._log is not None:
            await self._log.close()


AUDIT_SINK = web.AppKey("kvfence_audit_sink", AuditSink)


async def audit_sink_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[AUDIT_SINK].close()
