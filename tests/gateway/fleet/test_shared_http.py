"""Two gateway apps sharing one real redis-server (fake upstreams): a tenant's limits hold
across both, a quarantine decided by one is honoured by the other, Redis going away gives the
policy's behaviour, and nothing in Redis names a tenant or backend."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import redis

from gateway.policy.load import parse_policy
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def two_gateways(
    server: RedisServer, on_failure: str = "closed", limits: str = ""
) -> AsyncIterator[tuple[Gateway, Gateway, FakeUpstream, FakeUpstream]]:
    a, b = FakeUpstream(), FakeUpstream()
    await a.start()
    await b.start()
    shared = (
        f"  shared: {{redis: {{url: '{server.url}', timeout_s: 0.2}}, on_failure: {on_failure}}}\n"
    )
    text = fleet_policy_text(replica("a", a.url), replica("b", b.url), gateway=shared)
    if limits:
        text = text.replace("id: acme, ", f"id: acme, limits: {{{limits}}}, ")
    policy = parse_policy(text, "p.yaml", env=ENV)
    one, r1 = await run_gateway(policy, a)
    two, r2 = await run_gateway(policy, a)
    try:
        yield one, two, a, b
    finally:
        for gw, runner in ((one, r1), (two, r2)):
            await gw.session.close()
            await runner.cleanup()
        await a.close()
        await b.close()


async def status(gw: Gateway) -> int:
    resp = await gw.chat("acme", CHAT)
    await resp.read()
    return resp.status


async def answers(gw: Gateway) -> bool:
    return await status(gw) == 200


async def test_a_tenant_gets_one_allowance_across_both_gateways(
    redis_server: RedisServer,
) -> None:
    async with two_gateways(redis_server, limits="requests_per_s: 0.01, burst: 3") as gws:
        one, two = gws[0], gws[1]
        seen = [await status(gw) for gw in (one, two, one, two, one, two)]
        assert seen == [200, 200, 200, 429, 429, 429]
        resp = await two.chat("acme", CHAT)
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
        assert int(resp.headers["retry-after"]) > 1
        assert await status(one) == 429 and (await one.chat("globex", CHAT)).status == 200


async def test_a_quarantine_by_one_gateway_reaches_the_other(
    redis_server: RedisServer,
) -> None:
    async with two_gateways(redis_server) as (one, two, a, b):
        quarantine = partial(dataclasses.replace, quarantined=True, quarantine_reason="test")
        await one.app[WATCH].apply("a", quarantine)
        await until(lambda: two.app[VERIFY].health.get("a").quarantined, 2, "agreement")
        for _ in range(10):
            assert await status(two) == 200
        assert a.received == [] and len(b.received) == 10


async def test_redis_keys_and_values_name_no_tenant_or_backend(
    redis_server: RedisServer,
) -> None:
    async with two_gateways(redis_server, limits="concurrent: 4, tokens_per_min: 100000") as gws:
        one = gws[0]
        assert await status(one) == 200
        await one.app[WATCH].apply("a", lambda h: dataclasses.replace(h, rounds=1))
        client = redis.Redis.from_url(redis_server.url)
        keys = client.keys("*")
        assert keys and all(k.startswith(b"kvf1:") for k in keys)
        dump = b" ".join(keys)
        for key in keys:
            kind = client.type(key)
            if kind == b"hash":
                dump += b" ".join(b"%s=%s" % kv for kv in client.hgetall(key).items())
        assert b"acme" not in dump and b"fake" not in dump
        assert b'"backend":"a"' in dump  # a backend's state names it in the value only
        client.close()


@pytest.mark.parametrize(("mode", "expected"), [("closed", 503), ("local", 200)])
async def test_redis_down_gives_the_policys_behaviour(
    redis_server: RedisServer, mode: str, expected: int
) -> None:
    async with two_gateways(redis_server, mode, limits="requests_per_s: 100") as gws:
        one, two = gws[0], gws[1]
        assert await status(one) == 200
        await asyncio.to_thread(redis_server.stop)
        for gw in (one, two):
            resp = await gw.chat("acme", CHAT)
            assert resp.status == expected
            if expected == 503:
                assert (await resp.json())["error"]["code"] == "shared_state_unavailable"
        metrics = await one.metrics()
        assert "kvfence_gateway_shared_state_up 0.0" in metrics
        assert 'kvfence_gateway_shared_state_fallbacks_total{action="' + mode in metrics
        await asyncio.to_thread(redis_server.start)  # same port: both come back by themselves
        for gw in (one, two):
            await until(lambda gw=gw: answers(gw), 5, "recovery")  # type: ignore[misc]


async def test_one_replica_runs_each_due_canary_round(redis_server: RedisServer) -> None:
    async with two_gateways(redis_server) as (one, two, _, _):
        boards = [gw.app[VERIFY].health for gw in (one, two)]
        claims = [await board.claim_round("a", 60.0) for board in (*boards, *boards)]
        assert claims == [True, False, False, False]
        assert await boards[1].claim_round("b", 60.0), "each backend has its own round"
        await asyncio.to_thread(redis_server.stop)
        assert await boards[1].claim_round("a", 60.0), "Redis down: run it (one too many is safe)"
