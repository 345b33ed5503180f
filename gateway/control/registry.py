"""The tenant registry in the control-plane database: each change is the next numbered version
of the document (compare-and-set on the version), and every worker follows the newest.

Invariant: a worker never adopts a version older than the newest it, its state directory's
witness or the database has seen. A database behind that (restored from an older backup,
recreated empty) is named in one log line, counted and written back with the newer document, so
no restart and no restore brings a revoked key back; a version whose document does not hash to
its digest is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Final, TypeVar

from gateway.control.engine import ControlRefused, ControlUnavailable
from gateway.control.store import ControlStore, Version
from gateway.control.witness import Witness, digest_ok
from gateway.policy.registry import Document, RegistryError, decode, empty_document, encode

T = TypeVar("T")
TRIES: Final = 8
log = logging.getLogger("kvfence.gateway.control")
# (what happened, version): the audit record and the metric
Noted = Callable[[str, Version], Coroutine[None, None, None]]


def _version(doc: Document) -> Version:
    raw = encode(doc)
    return Version(int(doc["version"]), hashlib.sha256(raw).hexdigest(), raw)


class DatabaseRegistryStore:
    kind = "database"

    def __init__(
        self, store: ControlStore, witness: Witness, origin: str, legacy: Path | None = None
    ) -> None:
        self.store, self.witness, self.origin, self.legacy = store, witness, origin, legacy
        self.held: Version | None = None  # the newest version this worker believes
        self.noted: Noted | None = None
        self.rollbacks = 0
        self._notes: set[asyncio.Task[None]] = set()

    async def start(self) -> Document | None:
        """Before the first request: the newest of the witness and the database (the witness's
        when the database cannot answer, so known keys keep working and revoked ones stay so)."""
        self.held = await asyncio.to_thread(self.witness.load)
        try:
            if not self.store.migrated:
                await self.store.migrate()
            await self._import_legacy()
            doc = await self.changed()
        except ControlUnavailable as exc:
            log.error("control database unreachable at start", extra={"error": str(exc)})
            doc = None
        if doc is None and self.held is not None:
            return decode(self.held.document, "the control witness")
        return doc

    async def _import_legacy(self) -> None:
        """A registry file an earlier version kept becomes the first version of an empty one."""
        if self.legacy is None or not self.legacy.is_file():
            return
        if await self.store.head() is not None:
            return
        doc = decode(await asyncio.to_thread(self.legacy.read_bytes), str(self.legacy))
        if doc["version"] > 0 and await self.store.write_back(_version(doc), self.origin):
            log.warning("registry file imported into the control database",
                        extra={"path": str(self.legacy), "version": doc["version"]})  # fmt: skip

    async def changed(self) -> Document | None:
        """The document when the database holds a newer version than this worker believes.
        Raises ControlUnavailable when it cannot answer; RegistryError when what it holds does
        not open (the caller keeps what it has)."""
        head = await self._head_or_write_back()
        if head is None:
            return None
        held = self.held.number if self.held is not None else 0
        if head == (0, "") or (self.held is not None and head == (held, self.held.sha256)):
            return None
        newest = await self.store.newest()
        if newest is None:
            return None
        return await self._adopt(newest)

    async def _head_or_write_back(self) -> tuple[int, str] | None:
        """The database's newest (version, digest), (0, "") when it has none; None when it was
        behind this worker and has just been written back (nothing new to take)."""
        head = await self.store.head() or (0, "")
        if self.held is not None and head[0] < self.held.number:
            await self._write_back(head[0])
            return None
        return head

    async def _adopt(self, version: Version) -> Document:
        if not digest_ok(version):
            raise RegistryError(f"registry version {version.number} does not match its digest")
        doc = decode(version.document, f"registry version {version.number}")
        if doc["version"] != version.number:
            raise RegistryError(f"registry version {version.number} names another version")
        await asyncio.to_thread(self.witness.save, version)
        self.held = version
        self._note("adopted", version)
        return doc

    def _note(self, what: str, version: Version) -> None:
        """Record a version in the audit log and metrics without delaying its use: a revocation
        takes effect before its record is written."""
        if self.noted is None:
            return
        task = asyncio.get_running_loop().create_task(self.noted(what, version))
        self._notes.add(task)
        task.add_done_callback(self._notes.discard)

    async def _write_back(self, found: int) -> None:
        assert self.held is not None
        self.rollbacks += 1
        log.error(
            "control database is behind this gateway: restored from an older backup, or "
            "recreated? the newer registry stays in force and is written back",
            extra={"database": self.store.where, "found": found, "held": self.held.number},
        )
        self._note("rollback", self.held)
        await self.store.write_back(self.held, self.origin)

    async def update(self, change: Callable[[Document], T]) -> T:
        """Apply `change` to the newest document and store it as the next version, retried when
        another worker or gateway changed it meanwhile."""
        for _ in range(TRIES):
            # A database behind this worker is written back first; a newer version is not taken
            # here (the watch's refresh takes it and swaps it in).
            await self._head_or_write_back()
            newest = await self.store.newest()
            if newest is not None and not digest_ok(newest):
                raise RegistryError("the newest registry version does not match its digest")
            doc = empty_document() if newest is None else decode(newest.document, "registry")
            after = doc["version"]
            result = change(doc)
            doc["version"] = after + 1
            version = _version(doc)
            if await self.store.put(after, version, self.origin):
                return result  # the watch's refresh adopts it at once
        raise RegistryError("the registry kept changing under this change: retry")

    async def close(self) -> None:
        """Wait for the records still on their way (the control store closes on its own)."""
        if self._notes:
            await asyncio.gather(*self._notes, return_exceptions=True)


__all__ = ["ControlRefused", "ControlUnavailable", "DatabaseRegistryStore"]
