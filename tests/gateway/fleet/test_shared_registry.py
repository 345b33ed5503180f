"""The tenant registry in Redis (`registry: true` with `gateway.shared`): a tenant and key added
through one replica's admin listener are served by the other, a revocation reaches both; a
document forged in Redis is refused (and counted) while the last good one stays in force, and
replaying an older document does not bring a revoked key back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import redis

from gateway.policy.load import parse_policy
from gateway.server import bound_port, start_admin
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = {"authorization": "Bearer admin-token-0123456789abcdef"}


@pytest.fixture
async def replicas(
    redis_server: RedisServer,
) -> AsyncIterator[tuple[Gateway, Gateway, str]]:
    a = FakeUpstream()
    await a.start()
    shared = (
        f"  shared: {{redis: {{url: '{redis_server.url}', timeout_s: 0.5}}}}\n"
        "  admin: {host: 127.0.0.1, port: 0, token: {env: ADMIN}}\n  state_dir: STATE\n"
    )
    text = fleet_policy_text(replica("a", a.url), gateway=shared) + "registry: true\n"
    text = text.replace("  admin: {host: 127.0.0.1, port: 0}\n", "")
    started = []
    for n in range(2):  # two replicas: each its own state directory, one Redis
        env = {**ENV, "ADMIN": ADMIN["authorization"][7:]}
        policy = parse_policy(
            text.replace("STATE", f"{redis_server.folder}/s{n}"), "p.yaml", env=env
        )
        started.append(await run_gateway(policy, a))
    admin = await start_admin(started[0][0].app, "127.0.0.1", 0)
    yield started[0][0], started[1][0], f"http://127.0.0.1:{bound_port(admin)}"
    await admin.cleanup()
    for gw, runner in started:
        await gw.session.close()
        await runner.cleanup()
    await a.close()


async def call(gw: Gateway, key: str) -> int:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"}
    )
    return resp.status


def snapshot(url: str) -> dict[bytes, bytes]:
    client = redis.Redis.from_url(url)
    try:
        return {
            name: client.get(name) or b""
            for name in client.scan_iter("kvf2:*")
            if client.type(name) == b"string"
        }
    finally:
        client.close()


def restore(url: str, values: dict[bytes, bytes]) -> None:
    client = redis.Redis.from_url(url)
    try:
        for name, value in values.items():
            client.set(name, value)
    finally:
        client.close()


async def test_replicas_share_the_registry_and_refuse_forgeries_and_replays(
    replicas: tuple[Gateway, Gateway, str], redis_server: RedisServer
) -> None:
    one, two, admin = replicas
    async with aiohttp.ClientSession(headers=ADMIN) as http:
        async with http.post(admin + "/tenants", json={"id": "team9"}) as resp:
            assert resp.status == 200, await resp.text()
        async with http.post(admin + "/keys", json={"tenant": "team9", "label": "x"}) as resp:
            minted = await resp.json()
        key = minted["key"]
        await until(lambda: _served(two, key), what="the other replica serves the new key")
        before = snapshot(redis_server.url)
        assert not any(key.encode() in v for v in before.values())  # digests only

        # A forged document: a tenant the registry never had, its digest not the sealed one.
        (doc_name,) = [n for n, v in before.items() if v.startswith(b"{")]
        forged = json.loads(before[doc_name])
        forged["tenants"]["mallory"] = {"scope": "tenant", "models": ["smollm2"]}
        restore(redis_server.url, {doc_name: json.dumps(forged).encode()})
        async with http.post(admin + f"/keys/{minted['id']}/revoke") as resp:
            assert resp.status == 400  # the writer refuses to build on a forged document
        restore(redis_server.url, before)

        async with http.post(admin + f"/keys/{minted['id']}/revoke") as resp:
            assert resp.status == 200
        await until(lambda: _refused(two, key), what="the revocation reaches the other replica")
        restore(redis_server.url, before)  # replay the document from before the revocation
        for gw in (one, two):
            await until(lambda gw=gw: _counted(gw), what="the replayed document refused")
            assert await call(gw, key) == 401


async def _served(gw: Gateway, key: str) -> bool:
    return await call(gw, key) == 200


async def _refused(gw: Gateway, key: str) -> bool:
    return await call(gw, key) == 401


async def _counted(gw: Gateway) -> bool:
    return 'kvfence_gateway_registry_loads_total{result="refused"}' in await gw.metrics()
