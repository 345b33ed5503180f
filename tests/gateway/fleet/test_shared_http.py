"""Two gateway apps sharing one real redis-server (fake upstreams): a tenant's limits hold
across both, a quarantine decided by one is honoured by the other, Redis going away gives the
policy's behaviour, and nothing in Redis names a tenant or backend."""

from __future__ import annotations

import asyncio
import dataclasses
from functools import partial
from pathlib import Path

import pytest
import redis

from gateway.policy.model import HistorySettings
from gateway.shared import SHARED
from gateway.verify.history import Recorder
from gateway.verify.service import VERIFY
from gateway.verify.shared_history import SharedHistory
from gateway.verify.watch import WATCH
from tests.kit.gateway import PEPPER, Gateway
from tests.kit.polling import until
from tests.kit.redis_server import GATEWAY_USER, RedisServer, gateway_acl, need_redis
from tests.kit.shared_gateways import CHAT, two_gateways


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
        assert keys and all(k.startswith(b"kvf2:") for k in keys)
        values = []
        members = []  # the detective history's index: key names only
        for key in keys:
            kind = client.type(key)
            if kind == b"hash":
                values += client.hgetall(key).values()
            elif kind == b"zset":
                members += client.zrange(key, 0, -1)
            else:
                values.append(client.get(key))
        assert values and all(v.startswith(b"S1") for v in values)  # sealed
        assert all(m.startswith(b"kvf2:") for m in members)
        dump = b" ".join(keys + values + members)
        assert b"acme" not in dump and b"fake" not in dump and b"backend" not in dump
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
        ready = await one.session.get(one.url + "/readyz")
        assert ready.status == expected  # closed: not ready (it would refuse every request)
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


async def test_an_acl_user_reaches_a_redis_that_refuses_everyone_else(tmp_path: Path) -> None:
    """Redis as deployed (the rules read from deploy/compose.fleet.yml): its default user off,
    the gateways' ACL user allowed exactly what the gateways send, and nothing that could list,
    empty, script, stall or reconfigure the store."""
    need_redis()
    inspector = ("--user", "inspector", "on", ">inspect", "~*", "&*", "+@all")  # reads ACL LOG
    debug = ("--enable-debug-command", "yes")  # so that the ACL is what refuses DEBUG
    server = RedisServer(tmp_path, (*gateway_acl(PEPPER), *inspector, *debug))
    server.start()
    try:
        password = f"username: {GATEWAY_USER}, password: {{env: PEPPER}}"
        async with two_gateways(server, limits="requests_per_s: 100", redis=password) as gws:
            assert [await status(gw) for gw in gws[:2]] == [200, 200]
            await gws[0].app[WATCH].apply("a", lambda h: dataclasses.replace(h, rounds=1))
            await gws[1].app[VERIFY].health.refresh()
            assert gws[1].app[VERIFY].health.get("a").rounds == 1
            assert await gws[0].app[VERIFY].health.claim_round("a", 60.0)
            assert not await gws[1].app[VERIFY].health.claim_round("a", 60.0)
            store = gws[0].app[SHARED]
            assert store.up
            # Every table the fleet keeps works under the deployed rules: the detective's
            # history (its cap trimming too).
            history = SharedHistory(store, b"s" * 32, HistorySettings(tenant_cap=64))
            who = Recorder(tenant=1, namespace=2)
            assert await history.record(who, [5, 6], nonce=7) == [False, False]
            found = await history.presence(who, [5, 6], 8, [False, False])
            assert all(p.own for p in found)
            await history.record(who, list(range(100, 170)), nonce=9)
            [reach] = await history.reach()
            assert reach.entries == 64 and reach.evicted
            assert store.up
        with redis.Redis.from_url(server.url, username="inspector", password="inspect") as admin:
            assert admin.acl_log() == []  # nothing the gateways sent was refused
        with redis.Redis.from_url(server.url) as anyone, pytest.raises(redis.AuthenticationError):
            anyone.keys("*")
        gateway = redis.Redis.from_url(server.url, username=GATEWAY_USER, password=PEPPER)
        forbidden = [("SCAN", "0"), ("KEYS", "*"), ("EVAL", "while true do end", "0"),
                     ("EVALSHA", "0" * 40, "0"), ("SCRIPT", "LOAD", "return 1"), ("FLUSHALL",),
                     ("FLUSHDB",), ("DEBUG", "SLEEP", "0"), ("CONFIG", "GET", "*"),
                     ("SHUTDOWN",), ("SELECT", "1"), ("GET", "other:key")]  # fmt: skip
        with gateway:
            for command in forbidden:
                with pytest.raises(redis.exceptions.NoPermissionError):
                    gateway.execute_command(*command)
            assert gateway.ping()
    finally:
        server.stop()
