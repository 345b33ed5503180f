"""Token budgets per tenant and per registry key over calendar periods (hour, day, month, UTC),
beside the rate limits: which table holds the counts (this gateway's `local_budgets`, or Redis
with `gateway.shared`, under its `on_failure`), the check before a request is admitted and the
charge when it ends.

Invariant: a subject whose budget for a period is spent is refused (429 `budget_exceeded`) until
the period's window ends; a request is checked against both its tenant's and its key's budgets,
and its tokens are charged to both, once, from the usage its answer reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.fleet.local_budgets import PERIODS, LocalBudgets, window
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.registry import KeyInfo
from gateway.policy.tenant_model import Tenant, TenantBudgets

if TYPE_CHECKING:
    from gateway.fleet.budgets import RedisBudgets

log = logging.getLogger("kvfence.gateway.budgets")
_NAMES = {"hour": "hourly", "day": "daily", "month": "monthly"}


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


def _subjects(tenant: Tenant, key: KeyInfo | None) -> list[tuple[str, str, TenantBudgets]]:
    out = []
    if tenant.budgets.any:
        out.append(("tenant", f"t\0{tenant.id}", tenant.budgets))
    if key is not None and key.budgets.any:
        out.append(("key", f"k\0{key.id}", key.budgets))
    return out


class Budgeter:
    def __init__(self, local: LocalBudgets, shared: RedisBudgets | None = None) -> None:
        self.local, self.shared = local, shared
        self._charges: set[asyncio.Task[None]] = set()

    async def _spent(self, subject: str, now: float) -> dict[str, int]:
        store = self.shared.store if self.shared is not None else None
        if self.shared is not None and store is not None and store.up is not False:
            with contextlib.suppress(SharedUnavailable):  # counted and logged by the store
                return await self.shared.spent(subject, now)
        # Redis down: `on_failure: closed` refused the request before this (the limiter).
        return self.local.spent(subject, now)

    async def check(self, tenant: Tenant, key: KeyInfo | None) -> Spent | None:
        """None: every budget of the request has tokens left; else the first one spent."""
        now = time.time()
        for of, subject, budgets in _subjects(tenant, key):
            spent = await self._spent(subject, now)
            for period in PERIODS:
                budget = getattr(budgets, period)
                if budget and spent[period] >= budget:
                    return Spent(of, period, budget, window(period, now)[1])
        return None

    def charge(self, tenant: Tenant, key: KeyInfo | None, tokens: int) -> None:
        """The request ended having used `tokens` (without waiting for Redis)."""
        subjects = _subjects(tenant, key)
        if tokens <= 0 or not subjects:
            return
        now = time.time()
        if self.shared is None:
            for _, subject, _ in subjects:
                self.local.charge(subject, tokens, now)
            return
        task = asyncio.get_running_loop().create_task(self._charge(subjects, tokens, now))
        self._charges.add(task)
        task.add_done_callback(self._charges.discard)

    async def _charge(
        self, subjects: list[tuple[str, str, TenantBudgets]], tokens: int, now: float
    ) -> None:
        assert self.shared is not None
        for _, subject, _ in subjects:
            try:
                await self.shared.charge(subject, tokens, now)
            except SharedUnavailable:  # kept here, so this gateway still counts it
                self.local.charge(subject, tokens, now)
                log.warning("budget charge kept locally: Redis unreachable")

    async def drain(self) -> None:
        if self._charges:
            await asyncio.gather(*self._charges, return_exceptions=True)


BUDGETS = web.AppKey("kvfence_budgets", Budgeter)
