"""Per-tenant limits held in Redis, so every gateway replica (and every worker of each) gives a
tenant one allowance: the same rule as `local_limits` (`bucket`), each tenant's allowance one
sealed value (`sealed`, the tenant bound into its tag), changed in one optimistic transaction.

Invariant: an admission reads, decides and writes in one transaction (WATCH/MULTI), so replicas
never take the same allowance twice. A value that is not authentic never widens an allowance:
a worker that saw a newer one (a deleted or replayed value) uses its own, and one that saw none
starts a forged (or wrongly typed) tenant's buckets empty. Each request in flight carries a lease
(`shared.redis.lease_s`), so a replica that dies mid-request does not hold the slot for ever.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Final

import orjson
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from gateway.fleet import bucket
from gateway.fleet.bucket import FRESH, Allowance, Refusal
from gateway.fleet.store import SharedStore, as_bytes, typed
from gateway.policy.tenant_model import TenantLimits

_NAME: Final = "limits"  # the sealer's name for a tenant's allowance
_KEEP_S: Final = 86400  # an allowance unused this long is dropped (a fresh one is full again)


@dataclass(frozen=True, slots=True)
class Held:
    """A tenant's allowance as Redis holds it: the buckets, the leases of its requests in flight
    (token -> when the lease ends) and when it was written (by the writer's clock)."""

    allowance: Allowance = FRESH
    leases: dict[str, float] = field(default_factory=dict)
    written: float = 0.0

    def live(self, now: float) -> Held:
        leases = {t: end for t, end in self.leases.items() if end > now}
        return replace(self, leases=leases, allowance=replace(self.allowance, flight=len(leases)))


Step = Callable[[Held, float], tuple[Held, Refusal | None]]  # (allowance, now) -> new, refusal


def _encode(held: Held) -> bytes:
    a = held.allowance
    finite = [None if math.isinf(v) else v for v in (a.rps, a.tpm)]
    return orjson.dumps({"r": finite[0], "rt": a.rps_at, "k": finite[1], "kt": a.tpm_at,
                         "f": held.leases})  # fmt: skip


def _decode(data: bytes, written: float) -> Held | None:
    try:
        d = orjson.loads(data)
        rps = math.inf if d["r"] is None else float(d["r"])
        tpm = math.inf if d["k"] is None else float(d["k"])
        leases = {str(t): float(end) for t, end in d["f"].items()}
        allowance = Allowance(rps, float(d["rt"]), tpm, float(d["kt"]), len(leases))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None
    return Held(allowance, leases, written)


class RedisLimits:
    def __init__(self, store: SharedStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._memory: dict[str, Held] = {}  # the newest allowance this worker saw per tenant
        self._clock = clock

    async def _change(self, tenant: str, step: Step) -> Refusal | None:
        """Read the tenant's allowance, apply `step` and write the result, in one transaction;
        `step`'s refusal is returned (its state is written all the same: a refilled bucket)."""
        key = self.store.key("limits", tenant)
        async with self.store.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    now = self._clock()
                    raw = as_bytes(await typed(pipe.get(key), b""))  # another type: not ours
                    held = self._held(tenant, raw, now).live(now)
                    after, refusal = step(held, now)
                    await self._write(pipe, key, tenant, after, now)
                    return refusal
                except WatchError:
                    continue  # another worker or replica changed it: read it again

    def _held(self, tenant: str, raw: bytes | None, now: float) -> Held:
        """The allowance to decide on: Redis's when it is authentic and not older than what this
        worker saw; else this worker's; else a fresh one (nothing stored) or an empty one (a
        value that is not authentic: it must not widen the allowance)."""
        known = self._memory.get(tenant)
        opened = self.store.sealer.open(_NAME, tenant, raw)
        found = None if opened is None else _decode(opened.value, opened.written)
        if found is not None and (known is None or found.written >= known.written):
            return found
        why = "missing" if raw is None else "invalid" if found is None else "older"
        if known is not None:
            self.store.metrics.shared_refused.labels("limits", why).inc()
            return known
        if raw is None:
            return Held()
        self.store.metrics.shared_refused.labels("limits", why).inc()
        return Held(Allowance(0.0, now, 0.0, now))

    async def _write(self, pipe: Pipeline, key: str, tenant: str, held: Held, now: float) -> None:
        known = self._memory.get(tenant)
        written = max(now, held.written + 0.001, (known.written if known else 0.0) + 0.001)
        held = replace(held, written=written)
        pipe.multi()  # type: ignore[no-untyped-call]
        pipe.set(key, self.store.sealer.seal(_NAME, tenant, _encode(held), now=written), ex=_KEEP_S)
        await pipe.execute()
        self._memory[tenant] = held

    async def admit(self, tenant: str, limits: TenantLimits) -> tuple[str, Refusal | None]:
        """Take one request's allowance: (its lease token, None), or (_, why not). Raises
        `SharedUnavailable` when Redis cannot answer."""
        token = os.urandom(12).hex()
        lease_s = self.store.settings.lease_s

        def step(held: Held, now: float) -> tuple[Held, Refusal | None]:
            allowance, refusal = bucket.admit(held.allowance, limits, now)
            leases = held.leases if refusal else {**held.leases, token: now + lease_s}
            return replace(held, allowance=allowance, leases=leases), refusal

        refusal = await self.store.call("admit", self._change(tenant, step))
        return token, refusal

    async def hold(self, tenant: str, limits: TenantLimits, tokens: int) -> Refusal | None:
        """Hold a reservation of the tokens-per-minute bucket (`bucket.hold`)."""

        def step(held: Held, now: float) -> tuple[Held, Refusal | None]:
            allowance, refusal = bucket.hold(held.allowance, limits, tokens, now)
            return replace(held, allowance=allowance), refusal

        return await self.store.call("admit", self._change(tenant, step))

    async def release(self, tenant: str, token: str, tokens: int, limits: TenantLimits) -> None:
        """The request ended: its lease is given back and `tokens` charged."""

        def step(held: Held, now: float) -> tuple[Held, Refusal | None]:
            leases = {t: end for t, end in held.leases.items() if t != token}
            allowance = replace(bucket.charge(held.allowance, tokens), flight=len(leases))
            return replace(held, allowance=allowance, leases=leases), None

        await self.store.call("release", self._change(tenant, step))
