"""Garbage in Redis is refused, never an error: two gateway apps share one real redis-server,
and every key they keep (health board, canary claims, tenant allowances, the detective's
history and its reach) is overwritten with a value of the wrong shape, or replaced by a key of
the wrong Redis type; no request is then answered 500, and both gateways serve again by
themselves."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import redis

from gateway.verify.history import Recorder
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from tests.kit.gateway import Gateway
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer
from tests.kit.shared_gateways import CHAT, two_gateways

Corrupt = Callable[[redis.Redis, bytes], object]


def wrong_shape(client: redis.Redis, key: bytes) -> None:
    """Keep the key's type, make every value unreadable (a non-number, a cut value)."""
    kind = client.type(key)
    if kind == b"string":
        value = client.get(key) or b""
        client.set(key, value[: len(value) // 2] or b"12x")
    elif kind == b"hash":
        for field in client.hkeys(key):
            client.hset(key, field, b"not a number")
        client.hset(key, b"zz", b"S1garbage")
    elif kind == b"zset":
        client.zadd(key, {b"kvf2:nothing|1": float("inf"), b"no bar": 1.0})


def wrong_type(client: redis.Redis, key: bytes) -> None:
    """Replace the key with a list (every read of it answers WRONGTYPE)."""
    client.delete(key)
    client.rpush(key, b"garbage")


async def answers(gw: Gateway) -> int:
    resp = await gw.chat("acme", CHAT)
    body = await resp.json()
    assert resp.status != 500, body
    if resp.status == 503:
        assert body["error"]["code"] == "shared_state_unavailable"
    return resp.status


async def exercise(gws: tuple[Gateway, Gateway], healed: bool = True) -> list[int]:
    """Every path that reads the shared state: requests (limits, history), the health board's
    refresh and a change, a canary claim, the history's look-ups and the tenants' reach."""
    seen = []
    for gw in gws:
        seen.append(await answers(gw))
        verification = gw.app[VERIFY]
        await verification.health.refresh()
        await gw.app[WATCH].apply("a", lambda h: dataclasses.replace(h, rounds=h.rounds + 1))
        await verification.health.claim_round("a", 60.0)
        history, who = verification.store, Recorder(tenant=7, namespace=8)
        assert len(await history.record(who, [5, 6], 9)) == 2
        assert [p.own for p in await history.presence(who, [5, 6], 10, [False] * 2)] == [True] * 2
        reach = {r.tenant for r in await history.reach()}  # what /status shows
        assert 7 in reach or not healed
    return seen


@pytest.mark.parametrize("corrupt", [wrong_shape, wrong_type], ids=["shape", "type"])
async def test_garbage_in_every_key_is_refused_never_a_500(
    redis_server: RedisServer, corrupt: Corrupt
) -> None:
    async with two_gateways(redis_server, limits="requests_per_s: 100, burst: 100") as gws:
        one, two = gws[0], gws[1]
        assert await exercise((one, two)) == [200, 200]
        with redis.Redis.from_url(redis_server.url) as client:
            keys = client.keys("*")
            kinds = {client.type(k) for k in keys}
            assert {b"string", b"hash", b"zset"} <= kinds, kinds  # every kind the gateway keeps
            for key in keys:
                corrupt(client, key)
        assert set(await exercise((one, two), healed=False)) <= {200, 503}
        for gw in (one, two):
            await until(lambda gw=gw: answers_200(gw), 5, "serving again")  # type: ignore[misc]
        assert set(await exercise((one, two))) == {200}
        assert "kvfence_gateway_shared_state_refused_total{" in await one.metrics()


async def answers_200(gw: Gateway) -> bool:
    return await answers(gw) == 200
