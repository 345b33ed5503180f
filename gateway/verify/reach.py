"""How far back each tenant's history records reach, read every `EVERY_S`: a tenant whose cap
evicted records younger than `history.block_max_age_s` may see its own older hits attributed
to another namespace (withheld), so that is an alert: logged once an hour per tenant, in
/status and in metrics.

Invariant: reading the reach never changes the history; an unreachable shared history keeps
the last reading.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any, Final

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.model import Policy
from gateway.verify.history import Reach
from gateway.verify.service import Verification

log = logging.getLogger("kvfence.gateway.verify")
EVERY_S: Final = 30.0
WARN_EVERY_S: Final = 3600.0


class ReachWatch:
    def __init__(self, verification: Verification) -> None:
        self.verification = verification
        self.last: list[Reach] = []
        self.read_at = 0.0
        self._names: dict[int, str] = {}
        self._max_age = 0.0
        self._warned: dict[int, float] = {}

    async def tick(self, policy: Policy, now: float | None = None) -> None:
        """Read the reach when `EVERY_S` passed since the last reading."""
        now = time.time() if now is None else now
        if now - self.read_at >= EVERY_S:
            await self.read(policy, now)

    async def read(self, policy: Policy, now: float | None = None) -> None:
        """Read every tenant's reach now (and warn about a short one)."""
        now = time.time() if now is None else now
        self.read_at = now
        try:
            self.last = await self.verification.detective.history.reach()
        except SharedUnavailable:
            return
        recorder = self.verification.detective.recorder
        self._names = {recorder(t.id, "").tenant: t.id for t in policy.tenants}
        self._max_age = policy.gateway.history.block_max_age_s
        for reach in self.last:
            if self.short(reach, now) and now - self._warned.get(reach.tenant, 0.0) > WARN_EVERY_S:
                self._warned[reach.tenant] = now
                log.warning(
                    "history reach below block_max_age_s: raise history.tenant_cap",
                    extra={
                        "tenant": self.name(reach),
                        "reach_s": round(now - reach.complete_since),
                        "block_max_age_s": self._max_age,
                        "records": reach.entries,
                    },
                )

    def name(self, reach: Reach) -> str:
        return self._names.get(reach.tenant, f"tag:{reach.tenant:016x}")

    def short(self, reach: Reach, now: float) -> bool:
        """The tenant's cap evicted records the server may still hold."""
        return reach.evicted and now - reach.complete_since < self._max_age

    def status(self, now: float) -> dict[str, Any]:
        return {
            self.name(r): {
                "records": r.entries,
                "cap": r.cap,
                "complete_since": round(r.complete_since, 3),
                "reach_s": round(now - r.complete_since, 1),
                "short": self.short(r, now),
            }
            for r in self.last
        }


class ReachCollector(Collector):
    """`kvfence_gateway_history_reach_seconds{tenant}`, `..._history_records{tenant}` and
    `..._history_reach_short{tenant}`, as this worker last read them."""

    def __init__(self, watch: ReachWatch) -> None:
        self.watch = watch

    def collect(self) -> Iterator[Metric]:
        p, now = "kvfence_gateway_history_", time.time()
        reach = GaugeMetricFamily(
            p + "reach_seconds", "How far back a tenant's records are complete", labels=["tenant"]
        )
        records = GaugeMetricFamily(p + "records", "A tenant's history records", labels=["tenant"])
        short = GaugeMetricFamily(
            p + "reach_short",
            "1 while a tenant's reach is below block_max_age_s after evictions",
            labels=["tenant"],
        )
        for r in self.watch.last:
            name = self.watch.name(r)
            reach.add_metric([name], now - r.complete_since)
            records.add_metric([name], float(r.entries))
            short.add_metric([name], float(self.watch.short(r, now)))
        yield from (reach, records, short)
