"""The control plane's operations over one engine: migrations at open, the registry document's
versions, the spend ledger with its reservations, and quarantine decisions.

Invariant: a registry version is written only as the newest version plus one, or as a write-back
of a version the database lacks (a restore from an older backup); spend only grows within a
window; a reservation is admitted only while what is spent plus what is reserved is below the
budget, in one transaction, so concurrent requests overshoot by at most one reservation.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from gateway.control import ledger
from gateway.control.engine import ControlRefused, Engine, Steps, Tx, one
from gateway.control.ledger import Charge, Full, Hold, Spends
from gateway.control.schema import CREATE_TABLE, LATEST, MIGRATIONS

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Version:
    number: int
    sha256: str
    document: bytes


@dataclass(frozen=True, slots=True)
class Decision:
    backend: str
    quarantined: bool
    reason: str
    decided: float


class ControlStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.migrated = False

    @property
    def where(self) -> str:
        return f"{self.engine.kind} {self.engine.where}"

    async def migrate(self) -> None:
        """Apply the migrations the database lacks; refuse one a newer gateway wrote."""
        async with self.engine.transaction(lock="kvfence migrations") as tx:
            await tx.execute(CREATE_TABLE)
            done = {int(r[0]) for r in await tx.fetch("SELECT number FROM kvfence_migrations")}
            if done and max(done) > LATEST:
                raise ControlRefused(
                    f"the control database {self.where} has schema {max(done)}, newer than this "
                    f"gateway's {LATEST}: upgrade the gateway"
                )
            for number, statements in MIGRATIONS:
                if number in done:
                    continue
                for sql in statements:
                    await tx.execute(sql)
                await tx.execute(
                    "INSERT INTO kvfence_migrations (number, applied) VALUES (?, ?)",
                    number, time.time(),
                )  # fmt: skip
        self.migrated = True

    @contextlib.asynccontextmanager
    async def _tx(self, lock: str | None = None) -> AsyncIterator[Tx]:
        """A transaction on a migrated database (migrated first if the start could not)."""
        if not self.migrated:
            await self.migrate()
        async with self.engine.transaction(lock) as tx:
            yield tx

    def transaction(self, lock: str | None = None) -> contextlib.AbstractAsyncContextManager[Tx]:
        """For the modules beside this one that keep their own tables (receipts)."""
        return self._tx(lock)

    # The registry document.

    async def newest(self) -> Version | None:
        async with self._tx() as tx:
            return await _newest(tx)

    async def head(self) -> tuple[int, str] | None:
        async with self._tx() as tx:
            row = await one(tx, "SELECT version, sha256 FROM registry_versions "
                                "ORDER BY version DESC LIMIT 1")  # fmt: skip
        return None if row is None else (int(row[0]), str(row[1]))

    async def put(self, after: int, version: Version, origin: str) -> bool:
        """Write `version` (numbered `after + 1`) if the newest is still `after`."""
        async with self._tx(lock="kvfence registry") as tx:
            newest = await _newest(tx)
            if (newest.number if newest is not None else 0) != after:
                return False
            await _insert(tx, version, origin)
            return True

    async def write_back(self, version: Version, origin: str) -> bool:
        """Put back a version the database lacks and is older than (restored from a backup):
        True when written, False when the database holds it or a newer one already."""
        async with self._tx(lock="kvfence registry") as tx:
            newest = await _newest(tx)
            if newest is not None and newest.number >= version.number:
                return False
            await _insert(tx, version, origin)
            return True

    # The spend ledger (gateway.control.ledger).

    async def _atomically(self, lock: str | None, steps: Steps[T], synced: bool = True) -> T:
        if not self.migrated:
            await self.migrate()
        return await self.engine.atomically(lock, steps, synced)

    async def ledger(self, ops: Sequence[Hold | Charge]) -> list[Full | Spends]:
        """Apply `ops` in order in one transaction; each one's outcome (see `ledger.apply`).
        A batch of holds alone is not synced on its own (`ledger.needs_sync`)."""
        steps = ledger.apply(ops, time.time())
        return await self._atomically("kvfence spend", steps, ledger.needs_sync(ops))

    async def spent(self, subject: str, windows: Mapping[str, int]) -> dict[str, int]:
        return await self._atomically(None, ledger.spent(subject, windows))

    # Quarantine decisions.

    async def decide(self, decision: Decision, origin: str) -> None:
        async with self._tx(lock="kvfence quarantine") as tx:
            row = await one(tx, "SELECT COALESCE(MAX(seq), 0) FROM quarantine_decisions")
            seq = (int(row[0]) if row is not None else 0) + 1
            await tx.execute(
                "INSERT INTO quarantine_decisions (seq, backend, quarantined, reason, decided,"
                " origin) VALUES (?, ?, ?, ?, ?, ?)",
                seq, decision.backend, int(decision.quarantined), decision.reason,
                decision.decided, origin,
            )  # fmt: skip

    async def decisions(self) -> dict[str, Decision]:
        """The newest decision per backend."""
        async with self._tx() as tx:
            rows = await tx.fetch(
                "SELECT backend, quarantined, reason, decided FROM quarantine_decisions "
                "ORDER BY seq"
            )
        return {str(b): Decision(str(b), bool(q), str(r), float(d)) for b, q, r, d in rows}

    async def close(self) -> None:
        await self.engine.close()


async def _newest(tx: Tx) -> Version | None:
    row = await one(tx, "SELECT version, sha256, document FROM registry_versions "
                        "ORDER BY version DESC LIMIT 1")  # fmt: skip
    if row is None:
        return None
    return Version(int(row[0]), str(row[1]), str(row[2]).encode())


async def _insert(tx: Tx, version: Version, origin: str) -> None:
    await tx.execute(
        "INSERT INTO registry_versions (version, sha256, document, written, origin) "
        "VALUES (?, ?, ?, ?, ?)",
        version.number, version.sha256, version.document.decode(), time.time(), origin,
    )  # fmt: skip
