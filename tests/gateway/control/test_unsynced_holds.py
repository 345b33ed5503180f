"""A batch of budget holds alone is committed without a sync of its own (the next synced commit
carries it); every other transaction, a charge above all, is synced before it is reported, and
the connection never stays unsynced, not even after a batch that failed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypeVar

import pytest

from gateway.control.engine import ControlUnavailable, Steps
from gateway.control.ledger import Charge, Hold, needs_sync
from gateway.control.sqlite import SqliteEngine
from gateway.control.store import ControlStore
from gateway.fleet.budgeter import Budgeter, Reservation
from gateway.policy.tenant_model import Scope, Tenant, TenantBudgets

TENANT = Tenant("acme", (), Scope.TENANT, ("smollm2",), budgets=TenantBudgets(day=1_000))
T = TypeVar("T")
NORMAL, FULL = 1, 2  # PRAGMA synchronous


class Recording(SqliteEngine):
    """The real engine on a real file, noting whether each ledger transaction was synced."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.synced: list[bool] = []

    async def atomically(self, lock: str | None, steps: Steps[T], synced: bool = True) -> T:
        if lock == "kvfence spend":
            self.synced.append(synced)
        return await super().atomically(lock, steps, synced)


def _level() -> Steps[int]:
    rows = yield "PRAGMA synchronous", ()
    return int(rows[0][0])


def _failing() -> Steps[None]:
    yield "SELECT no_such_column FROM sqlite_master", ()


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[Recording]:
    engine = Recording(tmp_path / "control.db")
    yield engine
    await engine.close()


async def _level_outside(engine: SqliteEngine) -> int:
    async with engine.transaction("kvfence registry") as tx:
        rows = await tx.fetch("PRAGMA synchronous")
    return int(rows[0][0])


async def test_only_an_unsynced_batch_runs_without_a_sync_of_its_own(engine: Recording) -> None:
    assert await engine.atomically("kvfence spend", _level(), synced=False) == NORMAL
    assert await _level_outside(engine) == FULL  # a revocation after it is synced as ever
    assert await engine.atomically("kvfence spend", _level()) == FULL


async def test_a_failed_unsynced_batch_leaves_the_connection_synced(engine: Recording) -> None:
    with pytest.raises(ControlUnavailable):
        await engine.atomically("kvfence spend", _failing(), synced=False)
    assert await _level_outside(engine) == FULL
    assert await engine.atomically("kvfence spend", _level()) == FULL


def test_holds_alone_need_no_sync_and_any_charge_does() -> None:
    hold = Hold("r1", (("acme", {"day": 0}, {"day": 1_000}),), 300, 60.0)
    release = Charge("r1", (("acme", {"day": 0}),), 0)  # a hold whose request left
    assert not needs_sync([hold, hold])
    assert needs_sync([hold, release])
    assert needs_sync([Charge("r2", (("acme", {"day": 0}),), 120)])


async def test_a_budgeter_syncs_what_is_spent_and_the_spend_outlives_the_worker(
    engine: Recording, tmp_path: Path
) -> None:
    store = ControlStore(engine)
    await store.migrate()
    reservation = await Budgeter(store).reserve(TENANT, None, "r1", 300)
    assert isinstance(reservation, Reservation)
    await Budgeter(store).settle(reservation, 120)
    assert engine.synced == [False, True]  # the hold, then the charge
    again = SqliteEngine(tmp_path / "control.db")  # another worker, or this one restarted
    try:
        async with again.transaction() as tx:
            sql = "SELECT DISTINCT tokens FROM spend WHERE subject = ?"
            rows = await tx.fetch(sql, reservation.subjects[0])
            held = await tx.fetch("SELECT COUNT(*) FROM reservations")
        assert (rows, held) == ([(120,)], [(0,)])
    finally:
        await again.close()
