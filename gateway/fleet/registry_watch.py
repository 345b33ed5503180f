"""Keeping every worker's runtime on the registry's current document: each worker re-reads the
store every `INTERVAL_S` (the file's stamp, or the sealed head in Redis) and swaps in a runtime
built from the new document; a change made through this worker is applied at once.

Invariant: a revoked or expired key stops authenticating on every worker within one second of
the change (`INTERVAL_S` plus a read; expiry itself is checked on every lookup); a document that
cannot be read leaves the running registry in force, logged and counted, never an empty one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Final, Protocol, TypeVar

from aiohttp import web

from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.fleet.unavailable import SharedUnavailable
from gateway.metrics import Metrics
from gateway.policy.registry import Document, RegistryError
from gateway.policy.reload import PolicyHolder

T = TypeVar("T")
INTERVAL_S: Final = 0.25
log = logging.getLogger("kvfence.gateway.registry")


class RegistryStore(Protocol):
    kind: str

    async def changed(self) -> Document | None: ...
    async def update(self, change: Callable[[Document], T]) -> T: ...
    async def close(self) -> None: ...


class RegistryWatch:
    def __init__(self, holder: PolicyHolder, store: RegistryStore, metrics: Metrics) -> None:
        self.holder, self.store, self.metrics = holder, store, metrics
        self.error = ""  # why the last read failed (empty after a good one)
        self._problems: tuple[str, ...] = ()
        self._lock = asyncio.Lock()

    async def refresh(self) -> bool:
        """Read the store; True when a new document was swapped in."""
        async with self._lock:
            try:
                doc = await self.store.changed()
            except (RegistryError, SharedUnavailable, ControlUnavailable, ControlRefused) as exc:
                self._failed(str(exc) or type(exc).__name__)
                return False
            self.error = ""
            if doc is None:
                return False
            runtime = self.holder.swap(registry=doc)
            problems = runtime.registry.problems
            if problems != self._problems:
                for line in problems:
                    log.warning("registry entry left out", extra={"problem": line})
            self._problems = problems
            self.metrics.registry_loads.labels("ok").inc()
            return True

    def _failed(self, error: str) -> None:
        if error != self.error:
            log.error("registry unreadable; the running one stays", extra={"error": error})
        self.error = error
        self.metrics.registry_loads.labels("refused").inc()

    async def update(self, change: Callable[[Document], T]) -> T:
        """Apply one change to the store; this worker serves the result at once."""
        result = await self.store.update(change)
        await self.refresh()
        return result

    async def run(self) -> None:
        while True:
            await asyncio.sleep(INTERVAL_S)
            try:
                await self.refresh()
            except Exception as exc:  # the watch must not die
                self._failed(type(exc).__name__)


REGISTRY = web.AppKey("kvfence_registry", RegistryWatch)
