"""One history for a fleet: two gateway replicas sharing a real redis-server in front of one
server. A conversation whose second turn lands on the other replica is explained there (no
violation, no quarantine); a hit on another tenant's prompt sent through the other replica is
attributed and withheld; values in Redis that do not verify count as no record."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import orjson
import redis

from gateway.verify.service import VERIFY
from gateway.verify.shared_history import SharedHistory
from tests.fakes.cache_server import CacheServer
from tests.fakes.salt_dropping_proxy import RewritingProxy
from tests.kit.leak_scenarios import chat, document, read
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer
from tests.kit.verified_gateway import Verified, policy_text, verified_gateway

CANARY = "{interval_s: 3600, prompt_tokens: 64}"


@asynccontextmanager
async def replicas(tmp: Path, url: str, redis_url: str) -> AsyncIterator[tuple[Verified, Verified]]:
    async with AsyncExitStack() as stack:
        gws = []
        for name in ("one", "two"):  # each replica its own state directory: another host
            text = policy_text(url, tmp / name, canary=CANARY, detective="{block_size: 16}",
                               redis_url=redis_url)  # fmt: skip
            gws.append(await stack.enter_async_context(verified_gateway(text)))
        for gw in gws:
            await until(lambda gw=gw: gw.health().rounds >= 1, what="the first canary round")
        yield gws[0], gws[1]


async def turn(gw: Verified, tenant: str, messages: list[dict[str, str]]) -> tuple[int, str, str]:
    body = {"model": "smollm2", "messages": messages, "max_tokens": 2}
    resp = await gw.post(tenant, "/v1/chat/completions", body)
    doc = orjson.loads(await resp.read())
    text = doc["choices"][0]["message"]["content"] if resp.status == 200 else ""
    return resp.status, resp.headers.get("x-kvfence-verdict", "-"), text


async def test_a_conversation_across_two_replicas_is_explained(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = CacheServer()
    await fake.start()
    try:
        async with replicas(tmp_path, fake.url, redis_server.url) as (one, two):
            assert isinstance(two.app[VERIFY].store, SharedHistory)
            rng = random.Random(5)
            messages = [{"role": "user", "content": document(rng, 200)}]
            status, verdict, answer = await turn(one, "acme", messages)
            assert (status, verdict) == (200, "verified")
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": document(rng, 40)}]  # fmt: skip
            for gw in (two, one, two):  # the second turn, on either replica, hits the first
                status, verdict, _ = await turn(gw, "acme", messages)
                assert (status, verdict) == (200, "verified")
            assert fake.served[-1][1] > 0  # the server did report a hit
            for gw in (one, two):
                assert not gw.health().quarantined and gw.health().violations == {}
    finally:
        await fake.close()


async def test_a_hit_on_a_prompt_sent_through_the_other_replica_is_attributed(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = CacheServer()
    await fake.start()
    try:
        async with (
            RewritingProxy(fake.url, when=lambda path, body: "seed" in body) as leak,
            replicas(tmp_path, leak.url, redis_server.url) as (one, two),
        ):
            path, body = chat(seed=3)(document(random.Random(6), 300))
            assert (await read(await one.post("acme", path, body)))[0] == 200
            status, verdict, cached, _ = await read(await two.post("globex", path, body))
            assert (status, verdict, cached) == (502, "violation", 0)
            await until(lambda: two.health().quarantined, what="the round B's answer triggered")
    finally:
        await fake.close()


async def test_a_record_that_does_not_verify_is_no_record(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    fake = CacheServer()
    await fake.start()
    try:
        async with replicas(tmp_path, fake.url, redis_server.url) as (one, two):
            messages = [{"role": "user", "content": document(random.Random(7), 200)}]
            assert (await turn(one, "acme", messages))[:2] == (200, "verified")
            client = redis.Redis.from_url(redis_server.url)
            for name in client.scan_iter("kvf2:*"):  # whoever reaches Redis edits every record
                if client.type(name) == b"hash":
                    for field in client.hkeys(name):
                        client.hset(name, field, b"S1" + b"\0" * 60)
            status, verdict, _ = await turn(two, "acme", messages)
            assert (status, verdict) == (200, "unexplained")  # never explained, never foreign
            assert not two.health().quarantined
    finally:
        await fake.close()
