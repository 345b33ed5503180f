"""Quarantine decisions outlive every restart: a fleet sharing a real PostgreSQL and a real Redis
quarantines a backend; with every replica restarted on empty state folders and Redis holding the
older authentic value from before the quarantine, both come up with the backend quarantined; a
release, also a recorded decision, lifts it everywhere."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis

from gateway.policy.load import parse_policy
from gateway.shared import SHARED
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway
from tests.kit.polling import until
from tests.kit.postgres_server import PASSWORD, PostgresServer
from tests.kit.redis_server import RedisServer

QUARANTINE = {"quarantined": True, "quarantine_reason": "test", "canary": "shared"}
VERIFIED = {"quarantined": False, "canary": "isolated", "canary_reason": "", "rounds": 9}


@asynccontextmanager
async def replicas(
    pg: PostgresServer, rs: RedisServer, a: FakeUpstream, b: FakeUpstream
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    gateway = (
        f"  shared: {{redis: {{url: '{rs.url}', timeout_s: 0.5}}}}\n"
        f"  control: {{database: postgresql, url: '{pg.url}', password: {{env: PGPW}}}}\n"
    )
    text = fleet_policy_text(replica("a", a.url), replica("b", b.url), gateway=gateway)
    policy = parse_policy(text, "p.yaml", env={**ENV, "PGPW": PASSWORD})
    started = [await run_gateway(policy, a) for _ in range(2)]  # each a new state folder
    try:
        yield started[0][0], started[1][0]
    finally:
        for gw, runner in started:
            await gw.session.close()
            await runner.cleanup()


def quarantined(*gws: Gateway) -> bool:
    return all(gw.app[VERIFY].health.get("a").quarantined for gw in gws)


async def test_a_quarantine_outlives_empty_state_and_an_older_value_in_redis(
    postgres_server: PostgresServer, redis_server: RedisServer
) -> None:
    a, b = FakeUpstream(), FakeUpstream()
    await a.start()
    await b.start()
    try:
        async with replicas(postgres_server, redis_server, a, b) as (one, two):
            await one.app[WATCH].apply("a", lambda h: dataclasses.replace(h, **VERIFIED))
            store = one.app[SHARED]
            key, field = store.key("health"), store.key("backend", "a")
            with redis.Redis.from_url(redis_server.url) as client:
                old = client.hget(key, field)  # authentic, and from before the quarantine
            assert old is not None
            await one.app[WATCH].apply("a", lambda h: dataclasses.replace(h, **QUARANTINE))
            await until(lambda: quarantined(one, two), 5, "both replicas quarantine a")
        with redis.Redis.from_url(redis_server.url) as client:
            client.hset(key, field, old)  # the older value written back
        async with replicas(postgres_server, redis_server, a, b) as (one, two):
            assert quarantined(one, two)  # before any refresh: the decision holds from the start
            for gw in (one, two):
                health = gw.app[VERIFY].health.get("a")
                assert health.quarantined and health.quarantine_reason == "test"
            await one.app[WATCH].release("a")
            await until(lambda: not one.app[VERIFY].health.get("a").quarantined, 5, "released")
            await until(lambda: not two.app[VERIFY].health.get("a").quarantined, 5, "released")
        async with replicas(postgres_server, redis_server, a, b) as (one, two):
            assert not quarantined(one) and not quarantined(two)  # the release is a decision too
    finally:
        await a.close()
        await b.close()
