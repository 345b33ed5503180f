"""Opening the shared state for one gateway app: with `gateway.shared`, the verification health
board, the detective's history and the tenant limits move to Redis; without it, nothing
changes (all local).

Invariant: the store is opened once per worker and closed after every task that uses it;
Redis support (the `redis` extra) is imported only for a policy with `gateway.shared`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.metrics import FLEET_METRICS
from gateway.policy.model import Policy
from gateway.policy.reload import HOLDER
from gateway.state import LIMITER, METRICS, VERIFY

if TYPE_CHECKING:
    from gateway.fleet.limits import RedisLimits
    from gateway.fleet.store import SharedStore

SHARED: web.AppKey[SharedStore] = web.AppKey("kvfence_shared_store")


def missing_support(policy: Policy) -> str | None:
    """One line naming the extra to install when the policy asks for Redis and it is absent."""
    if policy.gateway.shared is None or importlib.util.find_spec("redis") is not None:
        return None
    return (
        "the policy sets gateway.shared, which needs Redis support: "
        "pip install 'kvfence[gateway,redis]'"
    )


class SharedCollector(Collector):
    """`kvfence_gateway_shared_state_up`: 1 while this worker reaches Redis."""

    def __init__(self, store: SharedStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "kvfence_gateway_shared_state_up", "1 while the shared state (Redis) answers"
        )
        up.add_metric([], float(bool(self.store.up)))
        yield up


def open_shared(app: web.Application, policy: Policy) -> RedisLimits | None:
    """Call after `VERIFY` is set and before anything holds its health board."""
    settings = policy.gateway.shared
    if settings is None:
        return None
    from gateway.fleet.health import SharedHealthBoard
    from gateway.fleet.limits import RedisLimits
    from gateway.fleet.store import SharedStore
    from gateway.verify.shared_history import SharedHistory

    store = app[SHARED] = SharedStore(settings, policy, app[FLEET_METRICS])
    verification = app[VERIFY]

    def backends() -> list[str]:
        return [b.name for b in app[HOLDER].runtime.policy.backends]

    verification.health = SharedHealthBoard(verification.state_dir / "health.json", store, backends)
    history = SharedHistory(store, verification.secret, policy.gateway.history)
    verification.use_history(history)  # one history for every replica
    app[METRICS].add_collector(SharedCollector(store))
    app.cleanup_ctx.append(_close)
    return RedisLimits(store)


async def _close(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[LIMITER].drain()
    await app[SHARED].close()
