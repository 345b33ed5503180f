"""The spend ledger by group commit: holds and charges that arrive while one transaction runs are
written together in the next, in order, and decide exactly what one transaction each decided; a
hold whose request left before its batch was written is released, not kept for its lease."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from gateway.control.engine import ControlUnavailable
from gateway.control.ledger import Charge, Full, Hold, Spends
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.fleet.budgeter import Budgeter, Reservation, Spent
from gateway.policy.tenant_model import Scope, Tenant, TenantBudgets

BUDGET = 1_000
TENANT = Tenant("acme", (), Scope.TENANT, ("smollm2",), budgets=TenantBudgets(day=BUDGET))


class Counted(ControlStore):
    """The real store on a real SQLite file, counting its ledger transactions."""

    def __init__(self, path: Path) -> None:
        super().__init__(SqliteEngine(path))
        self.batches: list[int] = []

    async def ledger(self, ops: Sequence[Hold | Charge]) -> list[Full | Spends]:
        self.batches.append(len(ops))
        return await super().ledger(ops)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Counted]:
    counted = Counted(tmp_path / "control.db")
    await counted.migrate()
    yield counted
    await counted.close()


async def held(store: Counted) -> int:
    async with store.transaction() as tx:
        rows = await tx.fetch("SELECT COUNT(*) FROM reservations")
    return int(rows[0][0])


async def test_forty_holds_at_once_share_transactions_and_pass_the_budget_by_one_at_most(
    store: Counted,
) -> None:
    budgets = Budgeter(store)
    outcomes = await asyncio.gather(
        *(budgets.reserve(TENANT, None, f"r{i}", 300) for i in range(40))
    )
    granted = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [o for o in outcomes if isinstance(o, Spent)]
    # 0 + 300 + 300 + 300 < 1,000 holds a fourth; 1,200 refuses every later one.
    assert (len(granted), len(refused)) == (4, 36)
    assert [o.rid for o in granted] == ["r0", "r1", "r2", "r3"]  # in the order they arrived
    assert sum(store.batches) == 40 and len(store.batches) < 40
    assert await held(store) == 4

    before = len(store.batches)
    await asyncio.gather(*(budgets.settle(r, 100) for r in granted))
    assert len(store.batches) - before < len(granted)
    assert await held(store) == 0
    assert (await budgets.spent("tenant:acme"))["day"] == 400


async def test_a_hold_whose_request_left_is_released(store: Counted) -> None:
    budgets = Budgeter(store)
    first = asyncio.create_task(budgets.reserve(TENANT, None, "stays", 300))
    await asyncio.sleep(0)  # its batch is being written: the next hold waits for the next one
    leaving = asyncio.create_task(budgets.reserve(TENANT, None, "leaves", 300))
    await asyncio.sleep(0)
    leaving.cancel()
    assert isinstance(await first, Reservation)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    for _ in range(500):  # the release is a charge of 0, written after the hold it frees
        if sum(store.batches) == 3:
            break
        await asyncio.sleep(0.01)
    assert sum(store.batches) == 3  # "stays", "leaves", then its release
    assert await held(store) == 1
    assert (await budgets.spent("tenant:acme"))["day"] == 0


class Flaky(Counted):
    """The store, down (every ledger transaction refused) while `down` is set."""

    down = False

    async def ledger(self, ops: Sequence[Hold | Charge]) -> list[Full | Spends]:
        if self.down:
            raise ControlUnavailable("the control database is down (the test says so)")
        return await super().ledger(ops)


async def test_a_charge_that_waited_for_the_database_is_written_once(tmp_path: Path) -> None:
    store = Flaky(tmp_path / "control.db")
    await store.migrate()
    budgets = Budgeter(store)
    first = await budgets.reserve(TENANT, None, "first", 10)
    assert isinstance(first, Reservation)
    await budgets.settle(first, 5)  # read back: this worker now knows the tenant's spend
    second = await budgets.reserve(TENANT, None, "second", 10)
    assert isinstance(second, Reservation)
    store.down = True
    await budgets.settle(second, 7)  # waits in the worker for the database
    store.down = False
    outcomes = await asyncio.gather(
        *(budgets.reserve(TENANT, None, f"then{i}", 10) for i in range(10))
    )
    assert all(isinstance(o, Reservation) for o in outcomes)
    assert (await budgets.spent("tenant:acme"))["day"] == 5 + 7
    await store.close()
