"""The embedded control-plane database: one SQLite file in the gateway's state directory (WAL,
synchronous commits), used by every worker of one gateway, each statement run off the event loop
on one thread per worker.

Invariant: every transaction that names a lock starts with BEGIN IMMEDIATE, so those of all
workers are serialised by SQLite's write lock and a read-check-write (a reservation, a
compare-and-set) is atomic across processes; a commit is on disk before it is reported, except
one its caller asks not to sync (`atomically(synced=False)`), which the next synced one carries.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from gateway.control.engine import ControlUnavailable, Row, Steps, drive_now

T = TypeVar("T")
BUSY_MS: Final = 10_000


class _Tx:
    def __init__(self, engine: SqliteEngine) -> None:
        self.engine = engine

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return await self.engine.run(lambda db: [tuple(r) for r in db.execute(sql, args)])

    async def execute(self, sql: str, *args: Any) -> None:
        await self.engine.run(lambda db: db.execute(sql, args))


class SqliteEngine:
    kind = "sqlite"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvfence-control")
        self._db: sqlite3.Connection | None = None
        self._lock = asyncio.Lock()

    def _open(self) -> sqlite3.Connection:
        if self._db is None:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.touch(mode=0o600, exist_ok=True)
            db = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, isolation_level=None,
                                 check_same_thread=False)  # fmt: skip
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
            self._db = db
        return self._db

    async def run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        def call() -> T:
            try:
                return work(self._open())
            except sqlite3.Error as exc:
                raise ControlUnavailable(f"the control database {self.path}: {exc}") from None
            except OSError as exc:
                raise ControlUnavailable(f"the control database {self.path}: {exc}") from None

        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    @contextlib.asynccontextmanager
    async def transaction(self, lock: str | None = None) -> AsyncIterator[_Tx]:
        # A named lock is a read-check-write: it takes SQLite's write lock first. A read takes a
        # snapshot and waits for no one (WAL).
        begin = "BEGIN IMMEDIATE" if lock is not None else "BEGIN"
        async with self._lock:  # one transaction at a time on this worker's connection
            await self.run(lambda db: db.execute(begin))
            try:
                yield _Tx(self)
            except BaseException:
                with contextlib.suppress(ControlUnavailable):
                    await self.run(lambda db: db.execute("ROLLBACK"))
                raise
            await self.run(lambda db: db.execute("COMMIT"))

    async def atomically(self, lock: str | None, steps: Steps[T], synced: bool = True) -> T:
        """`steps` whole in one call on this worker's thread: one hop, not one per statement.
        Unsynced, the commit is appended to the WAL without a sync of its own; the next synced
        commit (of any worker: they share the WAL) syncs it with its own. The connection is back
        to synchronous=FULL before anything else runs on it."""
        begin = "BEGIN IMMEDIATE" if lock is not None else "BEGIN"

        def whole(db: sqlite3.Connection) -> T:
            if synced:
                return _commit(db, begin, steps)
            db.execute("PRAGMA synchronous=NORMAL")
            try:
                return _commit(db, begin, steps)
            finally:
                self._synced_again(db)

        async with self._lock:  # one transaction at a time on this worker's connection
            return await self.run(whole)

    def _synced_again(self, db: sqlite3.Connection) -> None:
        try:
            db.execute("PRAGMA synchronous=FULL")
        except sqlite3.Error:  # never left unsynced: the next transaction opens a new connection
            self._db = None
            db.close()
            raise

    async def close(self) -> None:
        def shut() -> None:
            if self._db is not None:
                self._db.close()
                self._db = None

        await asyncio.get_running_loop().run_in_executor(self._pool, shut)
        self._pool.shutdown(wait=True)


def _commit(db: sqlite3.Connection, begin: str, steps: Steps[T]) -> T:
    db.execute(begin)
    try:
        result = drive_now(lambda sql, args: [tuple(r) for r in db.execute(sql, args)], steps)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
        raise
    return result
