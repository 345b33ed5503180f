"""The control-plane database for a fleet: PostgreSQL through asyncpg (an asyncio-native driver
with its own pool and binary protocol, so no statement blocks the event loop), one small pool
per worker.

Invariant: every statement has the policy's deadline; a transaction naming a lock takes a
transaction-scoped advisory lock on it first, so read-check-write sequences on one subject are
serialised across every gateway of the fleet.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any, Final, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from gateway.control.engine import ControlUnavailable, Row, Steps, drive

T = TypeVar("T")
POOL_SIZE: Final = 4
_PLACEHOLDER = re.compile(r"\?")
_FAILURES = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)


def _numbered(sql: str) -> str:
    """`?` placeholders as PostgreSQL's `$1, $2, ...` (no statement here has a literal `?`)."""
    count = iter(range(1, 1000))
    return _PLACEHOLDER.sub(lambda _: f"${next(count)}", sql)


def redacted(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" if parts.username else host
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


class _Tx:
    def __init__(self, conn: Any, timeout: float) -> None:
        self.conn, self.timeout = conn, timeout

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        rows = await self.conn.fetch(_numbered(sql), *args, timeout=self.timeout)
        return [tuple(r) for r in rows]

    async def execute(self, sql: str, *args: Any) -> None:
        await self.conn.execute(_numbered(sql), *args, timeout=self.timeout)


class PostgresEngine:
    kind = "postgresql"

    def __init__(self, url: str, password: str, timeout_s: float) -> None:
        self.url, self.where = url, redacted(url)
        self._password, self.timeout = password, timeout_s
        self._pool: Any = None
        self._opening = asyncio.Lock()

    async def _connected(self) -> Any:
        async with self._opening:
            if self._pool is None:
                self._pool = await asyncpg.create_pool(
                    self.url, password=self._password, min_size=0, max_size=POOL_SIZE,
                    timeout=self.timeout, command_timeout=self.timeout,
                )  # fmt: skip
        return self._pool

    @contextlib.asynccontextmanager
    async def transaction(self, lock: str | None = None) -> AsyncIterator[_Tx]:
        try:
            pool = await self._connected()
            async with pool.acquire(timeout=self.timeout) as conn, conn.transaction():
                tx = _Tx(conn, self.timeout)
                if lock is not None:
                    await tx.execute("SELECT pg_advisory_xact_lock(hashtextextended(?, 0))", lock)
                yield tx
        except _FAILURES as exc:
            detail = str(exc) or type(exc).__name__
            raise ControlUnavailable(f"the control database {self.where}: {detail}") from None

    async def atomically(self, lock: str | None, steps: Steps[T], synced: bool = True) -> T:
        """Always synced: several gateways share this database, and one whose primary fails over
        goes on serving, so an unsynced commit could vanish under a live request."""
        async with self.transaction(lock) as tx:
            return await drive(tx, steps)

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            with contextlib.suppress(*_FAILURES):
                await asyncio.wait_for(pool.close(), self.timeout)
