"""What the control plane needs of a database engine: a transaction that runs statements (written
with `?` placeholders) and returns rows, and the error that says the database cannot answer.

Invariant: a transaction either commits whole or leaves nothing; any failure to reach or use the
database is `ControlUnavailable` (the caller keeps what it holds, or refuses), never a partial
write believed done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

Row = tuple[Any, ...]


class ControlUnavailable(Exception):
    """The control-plane database cannot answer now (down, locked, timed out, unreadable)."""


class ControlRefused(Exception):
    """The database answered with something this gateway must not use: one line saying why."""


class Tx(Protocol):
    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...
    async def execute(self, sql: str, *args: Any) -> None: ...


class Engine(Protocol):
    kind: str  # "sqlite" | "postgresql"
    where: str  # the file or the URL without credentials, for messages

    def transaction(self, lock: str | None = None) -> AbstractAsyncContextManager[Tx]:
        """One transaction; `lock` serialises transactions that name the same string."""
        ...

    async def close(self) -> None: ...


async def one(tx: Tx, sql: str, *args: Any) -> Row | None:
    rows = await tx.fetch(sql, *args)
    return rows[0] if rows else None


__all__ = ["AsyncIterator", "ControlRefused", "ControlUnavailable", "Engine", "Row", "Tx", "one"]
