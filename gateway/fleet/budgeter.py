"""Token budgets per tenant and per registry key over calendar periods (hour, day, month, UTC),
kept in the control-plane database's spend ledger: a reservation when a request is admitted
(its `max_tokens`, else the model's limit, plus its prompt's bytes), settled on the usage its
answer reported (or its estimate) when it ends.

Invariant: a request is admitted only while what its subjects spent plus what is reserved for
requests in flight is below each budget, decided in one database transaction, so concurrent
requests on every worker and gateway overshoot a budget by at most one reservation. A worker
writes its holds and charges by group commit: those that arrive while one transaction runs go
together, in order, in the next (`gateway.control.ledger`), one hop to the database's thread and
one sync for all; a hold whose request left meanwhile is released by a charge of 0. A settled
charge is durable when the answer's record is written, except while the database cannot be
reached: then charges wait in this worker (retried every second) and admissions are decided on
the last spend read plus what waits (a crash of the worker loses what waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from gateway.control.engine import ControlUnavailable
from gateway.control.ledger import Charge, Full, Hold, Spends
from gateway.control.store import ControlStore
from gateway.fleet.windows import PERIODS, starts, window
from gateway.policy.registry import KeyInfo
from gateway.policy.tenant_model import Tenant, TenantBudgets

log = logging.getLogger("kvfence.gateway.budgets")
_NAMES = {"hour": "hourly", "day": "daily", "month": "monthly"}
RETRY_S: Final = 1.0


@dataclass(frozen=True, slots=True)
class Spent:
    """A refusal: whose budget (`of`: tenant or key), for which period, and when it renews."""

    of: str
    period: str
    budget: int
    renews: float

    @property
    def message(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(self.renews))
        return (
            f"this {'API key' if self.of == 'key' else 'tenant'}'s {_NAMES[self.period]} token "
            f"budget ({self.budget}) is spent; it renews at {when}"
        )


@dataclass(frozen=True, slots=True)
class Reservation:
    rid: str
    subjects: tuple[str, ...]
    tokens: int


@dataclass(slots=True)
class _Unsettled:
    reservation: Reservation
    tokens: int
    windows: dict[str, int] = field(default_factory=dict)


def _charge(item: _Unsettled) -> Charge:
    windows = item.windows
    return Charge(item.reservation.rid, tuple((s, windows) for s in item.reservation.subjects),
                  item.tokens)  # fmt: skip


def _quietly(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """A release nobody awaits: its failure is the lease's to clean up, not an error to log."""

    def done(task: asyncio.Task[Any]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()

    return done


def _subjects(tenant: Tenant, key: KeyInfo | None) -> list[tuple[str, str, TenantBudgets]]:
    out = []
    if tenant.budgets.any:
        out.append(("tenant", f"tenant:{tenant.id}", tenant.budgets))
    if key is not None and key.budgets.any:
        out.append(("key", f"key:{key.id}", key.budgets))
    return out


def _budgets(budgets: TenantBudgets) -> dict[str, int]:
    return {p: int(getattr(budgets, p)) for p in PERIODS if getattr(budgets, p)}


class Budgeter:
    def __init__(self, control: ControlStore, lease_s: float = 3600.0) -> None:
        self.control, self.lease_s = control, lease_s
        self._known: dict[str, dict[str, int]] = {}  # subject -> spend last read (by window)
        self._unsettled: list[_Unsettled] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._queued: list[tuple[Hold | Charge, asyncio.Future[Full | Spends]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._flushing = asyncio.Lock()
        self.failures = 0

    async def reserve(
        self, tenant: Tenant, key: KeyInfo | None, rid: str, tokens: int
    ) -> Reservation | Spent | None:
        """None: no budget applies; else a reservation to settle, or the first budget spent.
        Raises ControlUnavailable when the database cannot answer and this worker has never
        read the subject's spend (nothing to decide on)."""
        subjects = _subjects(tenant, key)
        if not subjects:
            return None
        now = time.time()
        windows = starts(now)
        asks = [(subject, windows, _budgets(b)) for _, subject, b in subjects]
        reservation = Reservation(rid, tuple(s for _, s, _ in subjects), tokens)
        try:
            if self._unsettled and not self._flushing.locked():  # never queue behind a flush
                await self._flush()
            full = await self._write(Hold(rid, tuple(asks), tokens, self.lease_s))
            assert not isinstance(full, dict)
        except ControlUnavailable:
            self.failures += 1
            full = self._decide_locally(asks)
        if full is None:
            return reservation
        subject, period, budget = full
        of = next(of for of, s, _ in subjects if s == subject)
        return Spent(of, period, budget, window(period, now)[1])

    def _decide_locally(
        self, asks: list[tuple[str, dict[str, int], dict[str, int]]]
    ) -> tuple[str, str, int] | None:
        for subject, windows, budgets in asks:
            if subject not in self._known:
                raise ControlUnavailable("the control database cannot be reached")
            waiting = sum(u.tokens for u in self._unsettled if subject in u.reservation.subjects)
            for period, budget in budgets.items():
                known = self._known[subject].get(f"{period}\0{windows[period]}", 0)
                if known + waiting >= budget:
                    return subject, period, budget
        return None

    def settle(self, reservation: Reservation, tokens: int) -> asyncio.Task[None]:
        """The request ended having used `tokens`: release its reservation and charge them.
        The caller awaits the task before the answer is done (the charge is then durable, or
        waiting here); a caller cancelled meanwhile leaves it to finish on its own."""
        item = _Unsettled(reservation, max(0, tokens), starts(time.time()))
        task = asyncio.get_running_loop().create_task(self._settle(item))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _settle(self, item: _Unsettled) -> None:
        try:
            spends = await self._write(_charge(item))
            assert isinstance(spends, dict)
            for subject, spent in spends.items():
                self._known[subject] = {f"{p}\0{item.windows[p]}": n for p, n in spent.items()}
        except ControlUnavailable:
            self.failures += 1
            self._unsettled.append(item)
            log.warning("budget charge waits: the control database cannot be reached")

    async def _flush(self) -> None:
        """Charges that waited for the database, written now (the oldest first, in one
        transaction: all of them or none), by one flush at a time: a charge is written once."""
        async with self._flushing:
            waiting = list(self._unsettled)
            if waiting:
                await self.control.ledger([_charge(item) for item in waiting])
                written = {id(item) for item in waiting}
                self._unsettled = [u for u in self._unsettled if id(u) not in written]

    async def _write(self, op: Hold | Charge) -> Full | Spends:
        """`op`'s outcome, written with every op queued while the transaction before ran."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Full | Spends] = loop.create_future()
        self._queued.append((op, future))
        if self._writer is None:
            self._writer = loop.create_task(self._write_batches())
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:  # its request left: a hold granted all the same is freed
            future.add_done_callback(functools.partial(self._left, op))
            raise

    def _left(self, op: Hold | Charge, future: asyncio.Future[Full | Spends]) -> None:
        if future.exception() is None and isinstance(op, Hold) and future.result() is None:
            release = Charge(op.rid, tuple((subject, w) for subject, w, _ in op.asks), 0)
            task = asyncio.get_running_loop().create_task(self._write(release))
            self._tasks.add(task)
            task.add_done_callback(_quietly(self._tasks))

    async def _write_batches(self) -> None:
        batch: list[tuple[Hold | Charge, asyncio.Future[Full | Spends]]] = []
        try:
            while self._queued:
                batch, self._queued = self._queued, []
                try:
                    outcomes = await self.control.ledger([op for op, _ in batch])
                except ControlUnavailable as exc:
                    for _, future in batch:
                        future.set_exception(exc)
                    continue
                for (_, future), outcome in zip(batch, outcomes, strict=True):
                    future.set_result(outcome)
        except BaseException:  # cancelled at shutdown, or a fault: nobody waits for nothing
            stopped = ControlUnavailable("the budget ledger's writer stopped")
            for _, future in [*batch, *self._queued]:
                if not future.done():
                    future.set_exception(stopped)
            self._queued = []
            raise
        finally:
            self._writer = None

    async def spent(self, subject: str) -> dict[str, int]:
        """Tokens spent in each current window (for `kvfence tenants list`)."""
        return await self.control.spent(subject, starts(time.time()))

    async def run(self) -> None:
        """Retry waiting charges every second while there are any."""
        while True:
            await asyncio.sleep(RETRY_S)
            if self._unsettled:
                with contextlib.suppress(ControlUnavailable):
                    await self._flush()

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(ControlUnavailable):
            await self._flush()
        if self._unsettled:
            log.error("budget charges lost at shutdown: the control database cannot be reached",
                      extra={"charges": len(self._unsettled)})  # fmt: skip


BUDGETS = web.AppKey("kvfence_budgets", Budgeter)
