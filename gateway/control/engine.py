"""What the control plane needs of a database engine: a transaction that runs statements (written
with `?` placeholders) and returns rows, a transaction written as `Steps` that the engine runs
whole (SQLite: in one hop to its thread), and the error that says the database cannot answer.

Invariant: a transaction either commits whole or leaves nothing; any failure to reach or use the
database is `ControlUnavailable` (the caller keeps what it holds, or refuses), never a partial
write believed done.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Generator
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol, TypeVar

Row = tuple[Any, ...]
T = TypeVar("T")
Statement = tuple[str, tuple[Any, ...]]
# A transaction's statements: each one yielded is run and the generator is sent its rows; what it
# returns is the transaction's outcome. It runs nothing itself, so an engine may run it anywhere.
Steps = Generator[Statement, list[Row], T]


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

    async def atomically(self, lock: str | None, steps: Steps[T], synced: bool = True) -> T:
        """`steps` as one transaction (`lock` as for `transaction`); what they return.
        `synced` False: the commit may wait for the next synced one to reach the disk (a machine
        crash before then undoes it; a process crash does not); an engine may sync it anyway."""
        ...

    async def close(self) -> None: ...


async def drive(tx: Tx, steps: Steps[T]) -> T:
    """Run `steps` statement by statement in `tx`."""
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(await tx.fetch(sql, *args))
    except StopIteration as done:
        result: T = done.value
        return result


def drive_now(fetch: Callable[[str, tuple[Any, ...]], list[Row]], steps: Steps[T]) -> T:
    """Run `steps` statement by statement through a blocking `fetch` (an engine's own thread)."""
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(fetch(sql, args))
    except StopIteration as done:
        result: T = done.value
        return result


async def one(tx: Tx, sql: str, *args: Any) -> Row | None:
    rows = await tx.fetch(sql, *args)
    return rows[0] if rows else None


__all__ = [
    "AsyncIterator",
    "ControlRefused",
    "ControlUnavailable",
    "Engine",
    "Row",
    "Statement",
    "Steps",
    "Tx",
    "drive",
    "drive_now",
    "one",
]
