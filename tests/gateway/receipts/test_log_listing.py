"""The receipt logs a witness is shown: every log under the gateway's prefix with its size, none
of another prefix, in the embedded SQLite database and in a real PostgreSQL, and without reading
every leaf (a million leaves are listed in a few lookups)."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.control.postgres import PostgresEngine
from gateway.control.receipts import ReceiptLedger
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from tests.kit.postgres_server import PASSWORD, PostgresServer

PREFIX = "gw.example/receipts/"
SIZES = {PREFIX + "acme": 5, PREFIX + "globex": 3, "gw.example/receiptsx": 2, "other/t": 4}


async def _fill(store: ControlStore, sizes: dict[str, int]) -> None:
    async with store.transaction() as tx:
        for log, n in sizes.items():
            for i in range(n):
                sql = "INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, ?, ?)"
                await tx.execute(sql, log, i, f"{i:064x}")


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ControlStore]:
    if request.param == "sqlite":
        engine: SqliteEngine | PostgresEngine = SqliteEngine(tmp_path / "control.db")
    else:
        pg: PostgresServer = request.getfixturevalue("postgres_server")
        engine = PostgresEngine(pg.url, PASSWORD, 10.0)
    store = ControlStore(engine)
    await store.migrate()
    yield store
    await store.close()


async def test_every_log_under_the_prefix_with_its_size(store: ControlStore) -> None:
    ledger = ReceiptLedger(store)
    assert await ledger.logs(PREFIX) == []
    await _fill(store, SIZES)
    assert await ledger.logs(PREFIX) == [(PREFIX + "acme", 5), (PREFIX + "globex", 3)]
    assert await ledger.logs("") == sorted(SIZES.items())


async def test_a_million_leaves_are_listed_without_reading_them(tmp_path: Path) -> None:
    path = tmp_path / "control.db"
    engine = SqliteEngine(path)
    store = ControlStore(engine)
    await store.migrate()
    with sqlite3.connect(path) as db:
        rows = ((PREFIX + "acme", i, "00") for i in range(1_000_000))
        db.executemany("INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, ?, ?)", rows)
        db.execute("INSERT INTO receipt_leaves (log, idx, hash) VALUES (?, 0, '00')", ("z",))
    steps: list[int] = []

    def count(_: object) -> int:
        steps.append(1)
        return 0

    try:
        await engine.run(lambda db: db.set_progress_handler(count, 1000))
        assert await ReceiptLedger(store).logs(PREFIX) == [(PREFIX + "acme", 1_000_000)]
        # SQLite's virtual machine steps, in thousands: a read of every leaf takes thousands.
        assert len(steps) < 10, len(steps)
    finally:
        await store.close()
