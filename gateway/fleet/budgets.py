"""Token budgets in the Redis the gateway replicas share (the twin of `local_budgets`): one
counter per subject, period and window, raised with INCRBY and expiring a day after its window.

Invariant: a window's count only grows, so this process never believes a lower count than it
has seen for a window (whoever writes to Redis can spend a tenant's budget, never widen it by
lowering or deleting a counter a replica has read); every operation has the store's deadline.
"""

from __future__ import annotations

from typing import Final

from gateway.fleet.local_budgets import PERIODS, window
from gateway.fleet.store import SharedStore

GRACE_S: Final = 86400  # a counter outlives its window by this (then Redis drops it)


class RedisBudgets:
    def __init__(self, store: SharedStore) -> None:
        self.store = store
        self._seen: dict[str, int] = {}  # counter key -> the highest count read or written
        self._pruned_at = 0.0

    def _keys(self, subject: str, now: float) -> list[tuple[str, float]]:
        out = []
        for period in PERIODS:
            start, end = window(period, now)
            out.append((self.store.key("budget", f"{subject}\0{period}\0{int(start)}"), end))
        return out

    def _floor(self, key: str, value: int) -> int:
        seen = max(self._seen.get(key, 0), value)
        self._seen[key] = seen
        return seen

    async def spent(self, subject: str, now: float) -> dict[str, int]:
        keys = self._keys(subject, now)
        raw = await self.store.call("budget_read", self.store.client.mget([k for k, _ in keys]))
        return {
            period: self._floor(key, int(value or 0))
            for period, (key, _), value in zip(PERIODS, keys, raw, strict=True)
        }

    async def charge(self, subject: str, tokens: int, now: float) -> None:
        pipe = self.store.client.pipeline(transaction=False)
        keys = self._keys(subject, now)
        for key, end in keys:
            pipe.incrby(key, tokens)
            pipe.expireat(key, int(end + GRACE_S))
        results = await self.store.call("budget_charge", pipe.execute())
        for (key, _), total in zip(keys, results[::2], strict=True):
            self._floor(key, int(total))
        if now - self._pruned_at > 3600:  # forget windows that have ended
            self._pruned_at, live = now, {k for k, _ in keys}
            self._seen = {k: v for k, v in self._seen.items() if k in live}
