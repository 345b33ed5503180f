"""Shared state that whoever reaches Redis cannot bend: two gateway apps share one real
redis-server; a quarantine survives Redis restarting empty, and a forged, replayed, future-dated
or deleted value neither lifts it nor marks a backend verified, nor widens a tenant's limits, nor
stops a canary round."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Awaitable, Callable

import orjson
import pytest
import redis

from gateway.fleet.sealed import Sealer
from gateway.fleet.store import SharedStore
from gateway.shared import SHARED
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import Gateway
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer
from tests.kit.shared_gateways import CHAT, two_gateways

USERS = [f"user-{i}" for i in range(8)]  # namespaces enough that some rank backend `a` first
QUARANTINE = {"quarantined": True, "quarantine_reason": "test", "canary": "shared"}
VERIFIED = {"quarantined": False, "canary": "isolated", "canary_reason": "", "rounds": 9}


async def spread(gws: tuple[Gateway, Gateway], a: FakeUpstream) -> int:
    """One request per user through each gateway; how many reached `a`."""
    before = len(a.received)
    for gw in gws:
        for user in USERS:
            resp = await gw.chat("initech", CHAT, **{"x-end-user": user})
            assert resp.status == 200, await resp.text()
    return len(a.received) - before


def quarantined_everywhere(gws: tuple[Gateway, Gateway]) -> bool:
    return all(gw.app[VERIFY].health.get("a").quarantined for gw in gws)


def quarantine_stored(store: SharedStore, raw: bytes | None) -> bool:
    """`raw` is backend a's health as a gateway sealed it, and it says quarantined."""
    opened = store.sealer.open("health", "a", raw)
    return opened is not None and orjson.loads(opened.value)["quarantined"] is True


async def quarantine(one: Gateway, two: Gateway) -> None:
    await one.app[WATCH].apply("a", lambda h: dataclasses.replace(h, **QUARANTINE))
    await until(lambda: quarantined_everywhere((one, two)), 5, "agreement")


async def test_a_quarantine_survives_redis_restarting_empty(redis_server: RedisServer) -> None:
    async with two_gateways(redis_server) as (one, two, a, _):
        assert await spread((one, two), a) > 0  # without a quarantine `a` gets its share
        await quarantine(one, two)
        await asyncio.to_thread(redis_server.stop)
        await asyncio.to_thread(redis_server.start)  # the same port, nothing in it
        with redis.Redis.from_url(redis_server.url) as client:
            key, field = one.app[SHARED].key("health"), one.app[SHARED].key("backend", "a")
            await until(lambda: client.hget(key, field), 10, "the quarantine written back")
        await until(lambda: one.app[SHARED].up and two.app[SHARED].up, 5,
                    "both replicas reconnected")  # fmt: skip
        assert await spread((one, two), a) == 0
        assert quarantined_everywhere((one, two))


def _attack(kind: str, one: Gateway, old: bytes) -> Callable[[redis.Redis], object]:
    store = one.app[SHARED]
    key, field = store.key("health"), store.key("backend", "a")
    value = orjson.dumps(VERIFIED | {"canary_at": time.time()})
    if kind == "forged":  # sealed under a key that is not the gateways'
        raw = Sealer(b"whoever reaches redis").seal("health", "a", value)
        return lambda c: c.hset(key, field, raw)
    if kind == "moved":  # backend b's authentic value, put in a's place
        raw = store.sealer.seal("health", "b", value)
        return lambda c: c.hset(key, field, raw)
    if kind == "future_dated":
        raw = store.sealer.seal("health", "a", value, now=time.time() + 3600)
        return lambda c: c.hset(key, field, raw)
    if kind == "replayed":  # the authentic value from before the quarantine
        return lambda c: c.hset(key, field, old)
    return lambda c: c.flushall()  # deleted


@pytest.mark.parametrize("kind", ["forged", "moved", "future_dated", "replayed", "deleted"])
async def test_a_value_that_is_not_authentic_and_new_lifts_nothing(
    redis_server: RedisServer, kind: str
) -> None:
    async with two_gateways(redis_server) as (one, two, a, _):
        await one.app[WATCH].apply("a", lambda h: dataclasses.replace(h, **VERIFIED))
        store = one.app[SHARED]
        key, field = store.key("health"), store.key("backend", "a")
        with redis.Redis.from_url(redis_server.url) as client:
            old = client.hget(key, field)
            assert old is not None
            await quarantine(one, two)
            _attack(kind, one, old)(client)
            # What the gateways write back is authentic and still says quarantined (its bytes
            # may be newer than before the attack: a health check can change a field meanwhile).
            await until(lambda: quarantine_stored(store, client.hget(key, field)), 10,
                        "the quarantine written back")  # fmt: skip
        for gw in (one, two):
            health = gw.app[VERIFY].health.get("a")
            assert health.quarantined and health.canary == "shared", (gw.url, health)
        assert await spread((one, two), a) == 0
        assert "kvfence_gateway_shared_state_refused_total" in await one.metrics()


async def test_a_forged_or_deleted_allowance_does_not_widen_a_tenants_limits(
    redis_server: RedisServer,
) -> None:
    async with two_gateways(redis_server, limits="requests_per_s: 0.01, burst: 2") as gws:
        one, two = gws[0], gws[1]

        async def statuses() -> list[int]:
            out = []
            for gw in (one, two):
                resp = await gw.chat("acme", CHAT)
                await resp.read()
                out.append(resp.status)
            return out

        assert await statuses() == [200, 200] and await statuses() == [429, 429]
        limits_key = one.app[SHARED].key("limits", "acme")
        forged = Sealer(b"whoever reaches redis").seal("limits", "acme", b"{}")
        attacks: list[Callable[[redis.Redis], object]] = [
            lambda c: c.delete(limits_key),
            lambda c: c.set(limits_key, forged),
            lambda c: c.flushall(),
        ]
        with redis.Redis.from_url(redis_server.url) as client:
            for attack in attacks:
                attack(client)
                assert await statuses() == [429, 429]


async def test_a_forged_claim_does_not_stop_a_canary_round(redis_server: RedisServer) -> None:
    async with two_gateways(redis_server) as (one, two, _, _):
        claim_key = one.app[SHARED].key("canary", "a")
        with redis.Redis.from_url(redis_server.url) as client:
            client.set(claim_key, b"S1" + b"\0" * 60, px=60_000)
        boards = [gw.app[VERIFY].health for gw in (one, two)]
        runs: list[Callable[[], Awaitable[bool]]] = [
            lambda b=b: b.claim_round("a", 60.0)
            for b in boards  # type: ignore[misc]
        ]
        assert [await run() for run in runs] == [True, False]  # taken over, then held
