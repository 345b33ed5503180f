"""Which table a tenant's limits are taken from: this gateway's own (`local_limits`, shared by
its workers), or Redis when the policy has `gateway.shared`, with the policy's `on_failure`
while Redis cannot be reached: `closed` refuses (503), `local` takes this gateway's table.

Invariant: an admission is released in the table it was taken from, exactly once; with
`on_failure: closed` no proxied request is admitted while the shared state is unreachable
(this replica could not see another's quarantine either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.errors import SharedStateUnavailable
from gateway.fleet.local_limits import Refusal, SharedLimits
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.tenant_model import Tenant

if TYPE_CHECKING:  # Redis is imported only when the policy has `gateway.shared`
    from gateway.fleet.limits import RedisLimits
    from gateway.fleet.store import SharedStore

log = logging.getLogger("kvfence.gateway.shared")


@dataclass(slots=True)
class Admission:
    token: str | None  # the Redis lease; None: taken from the local table
    held: int = 0  # tokens held of the tokens-per-minute bucket (`hold`)


class Limiter:
    def __init__(self, local: SharedLimits, shared: RedisLimits | None = None) -> None:
        self.local = local
        self.shared = shared
        self._releases: set[asyncio.Task[None]] = set()

    @property
    def store(self) -> SharedStore | None:
        return self.shared.store if self.shared is not None else None

    async def admit(self, tenant: Tenant) -> Admission | Refusal | None:
        """None: the tenant has no limits; else an admission to release, or a refusal."""
        store = self.store
        if store is not None and store.closed and store.up is False:
            self._refuse(store, "request")
        if not tenant.limits.any:
            return None
        if self.shared is None or store is None:
            return self.local.admit(tenant.id, tenant.limits) or Admission(None)
        if store.up is not False:  # known down: the health refresher notices its return
            with contextlib.suppress(SharedUnavailable):  # counted and logged by the store
                token, refusal = await self.shared.admit(tenant.id, tenant.limits)
                return refusal or Admission(token)
        if store.closed:
            self._refuse(store, "limits")
        store.metrics.shared_fallbacks.labels("limits", "local").inc()
        return self.local.admit(tenant.id, tenant.limits) or Admission(None)

    async def hold(self, tenant: Tenant, admission: Admission, tokens: int) -> Refusal | None:
        """Hold `tokens` of the tenant's tokens-per-minute allowance for this admitted request,
        in the table its admission came from; a refusal holds nothing."""
        if not tenant.limits.tokens_per_min:
            return None
        if admission.token is None or self.shared is None:
            refusal = self.local.hold(tenant.id, tenant.limits, tokens)
        else:
            try:
                refusal = await self.shared.hold(tenant.id, tenant.limits, tokens)
            except SharedUnavailable:  # counted and logged by the store; the lease covers it
                refusal = self.local.hold(tenant.id, tenant.limits, tokens)
        if refusal is None:
            admission.held = tokens
        return refusal

    def _refuse(self, store: SharedStore, what: str) -> None:
        store.metrics.shared_fallbacks.labels(what, "closed").inc()
        raise SharedStateUnavailable(
            "the gateway cannot reach its shared state (gateway.shared, on_failure: closed); "
            "retry shortly",
            1.0,
        )

    def release(self, tenant: Tenant, admission: Admission | None, tokens: int) -> None:
        """The request ended: free its in-flight slot and charge its tokens (without waiting
        for Redis: the call runs in the background, and its lease covers a lost one)."""
        if admission is not None:
            tokens -= admission.held  # what it held was taken when it was admitted
        if admission is None or admission.token is None or self.shared is None:
            self.local.release(tenant.id, tokens)
            return
        task = asyncio.get_running_loop().create_task(
            self._release(tenant, admission.token, tokens)
        )
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, tenant: Tenant, token: str, tokens: int) -> None:
        assert self.shared is not None
        try:
            await self.shared.release(tenant.id, token, tokens, tenant.limits)
        except SharedUnavailable:
            log.warning("limit release lost; its lease expires", extra={"tenant": tenant.id})

    async def drain(self) -> None:
        """Wait for releases still on their way (at shutdown)."""
        if self._releases:
            await asyncio.gather(*self._releases, return_exceptions=True)


LIMITER = web.AppKey("kvfence_limiter", Limiter)  # tenant limits: local or in Redis
