"""The tenant registry of a fleet in a real PostgreSQL (`gateway.control`), two replicas beside a
real Redis: a tenant and key added through one replica are served by both, and a revocation
reaches both; losing Redis loses nothing; a database restored from a backup taken before the
revocation serves the revoked key on no gateway (running, restarted or new), and is written
back; a database that stops keeps known keys served and refuses changes until it returns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest

from gateway.policy.load import parse_policy
from gateway.server import bound_port, start_admin
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway
from tests.kit.polling import until
from tests.kit.postgres_server import PASSWORD, PostgresServer
from tests.kit.redis_server import RedisServer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
TOKEN = "admin-token-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {TOKEN}"}
Start = Callable[[Path], "asynccontextmanager[Gateway]"]


def fleet_text(pg: PostgresServer, redis: RedisServer, upstream: FakeUpstream) -> str:
    gateway = (
        f"  shared: {{redis: {{url: '{redis.url}', timeout_s: 0.5}}}}\n"
        f"  control: {{database: postgresql, url: '{pg.url}', password: {{env: PGPW}},"
        " timeout_s: 2}\n"
        "  admin: {host: 127.0.0.1, port: 0, token: {env: ADMIN}}\n  state_dir: STATE\n"
    )
    text = fleet_policy_text(replica("a", upstream.url), gateway=gateway) + "registry: true\n"
    return text.replace("  admin: {host: 127.0.0.1, port: 0}\n", "")


class Fleet:
    def __init__(self, text: str, upstream: FakeUpstream) -> None:
        self.text, self.upstream = text, upstream

    @asynccontextmanager
    async def replica(self, state: Path) -> AsyncIterator[Gateway]:
        env = {**ENV, "ADMIN": TOKEN, "PGPW": PASSWORD}
        policy = parse_policy(self.text.replace("STATE", str(state)), "p.yaml", env=env)
        gw, runner = await run_gateway(policy, self.upstream)
        try:
            yield gw
        finally:
            await gw.session.close()
            await runner.cleanup()


@pytest.fixture
async def fleet(postgres_server: PostgresServer, redis_server: RedisServer) -> AsyncIterator[Fleet]:
    upstream = FakeUpstream()
    await upstream.start()
    yield Fleet(fleet_text(postgres_server, redis_server, upstream), upstream)
    await upstream.close()


async def call(gw: Gateway, key: str) -> int:
    """One request on a connection of its own (a replica's keep-alive may end meanwhile)."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http,
        http.post(gw.url + "/v1/chat/completions", json=CHAT,
                  headers={"authorization": f"Bearer {key}"}) as resp,
    ):  # fmt: skip
        await resp.read()
        return resp.status


@asynccontextmanager
async def admin_of(gw: Gateway) -> AsyncIterator[tuple[aiohttp.ClientSession, str]]:
    runner = await start_admin(gw.app, "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(headers=ADMIN) as http:
            yield http, f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


async def post(http: aiohttp.ClientSession, url: str, body: object = None) -> tuple[int, dict]:
    async with http.post(url, json=body if body is not None else {}) as resp:
        return resp.status, await resp.json()


async def test_revocations_outlive_redis_restarts_and_database_restores(
    fleet: Fleet, postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    async with (
        fleet.replica(tmp_path / "s1") as one,
        fleet.replica(tmp_path / "s2") as two,
        admin_of(one) as (http, admin),
    ):
        assert (await post(http, admin + "/tenants", {"id": "team9"}))[0] == 200
        status, kept = await post(http, admin + "/keys", {"tenant": "team9", "label": "kept"})
        assert status == 200
        status, doomed = await post(http, admin + "/keys", {"tenant": "team9", "label": "doomed"})
        assert status == 200
        for gw in (one, two):
            await until(lambda gw=gw: _is(gw, doomed["key"], 200), what="both serve the key")
        backup = postgres_server.dump()  # taken before the revocation
        status, _ = await post(http, admin + f"/keys/{doomed['id']}/revoke")
        assert status == 200
        for gw in (one, two):
            await until(lambda gw=gw: _is(gw, doomed["key"], 401), what="revoked on both")

        # Redis restarted empty: nothing of the registry was there to lose.
        redis_server.stop()
        redis_server.start()
        for gw in (one, two):
            await until(lambda gw=gw: _is(gw, kept["key"], 200), what="served after Redis")
            assert await call(gw, doomed["key"]) == 401
        status, _ = await post(http, admin + "/keys", {"tenant": "team9", "label": "later"})
        assert status == 200  # changes are possible

        # The database restored from the backup: the running replicas write the newer
        # registry back, and count it.
        postgres_server.restore(backup)
        for gw in (one, two):
            assert await call(gw, doomed["key"]) == 401
        await until(lambda: _rolled_back(one, two), 30, "the restore detected and counted")

        async def written_back() -> bool:  # tenant, two keys, the revocation, the later key
            sql = "SELECT max(version) FROM registry_versions"
            return int(await asyncio.to_thread(postgres_server.psql, "kvfence", sql)) == 5

        await until(written_back, 30, "the newer registry written back")

    # Every gateway restarted (same state folders), then a new replica with none.
    async with fleet.replica(tmp_path / "s1") as again, fleet.replica(tmp_path / "s3") as new:
        for gw in (again, new):
            assert await call(gw, doomed["key"]) == 401
            assert await call(gw, kept["key"]) == 200


async def test_a_restore_with_every_gateway_down_is_refused_by_their_witness(
    fleet: Fleet, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    async with fleet.replica(tmp_path / "s1") as one, admin_of(one) as (http, admin):
        await post(http, admin + "/tenants", {"id": "team9"})
        _, doomed = await post(http, admin + "/keys", {"tenant": "team9"})
        backup = postgres_server.dump()
        assert (await post(http, admin + f"/keys/{doomed['id']}/revoke"))[0] == 200
    postgres_server.restore(backup)  # while no gateway runs
    async with fleet.replica(tmp_path / "s1") as one:  # its state folder's witness knows better
        assert await call(one, doomed["key"]) == 401
        assert "kvfence_gateway_control_rollbacks_total 1.0" in await one.metrics()
    async with fleet.replica(tmp_path / "new") as new:  # the newer version was written back
        assert await call(new, doomed["key"]) == 401


async def test_a_stopped_database_keeps_known_keys_served_and_refuses_changes(
    fleet: Fleet, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    async with fleet.replica(tmp_path / "s1") as one, admin_of(one) as (http, admin):
        await post(http, admin + "/tenants", {"id": "team9"})
        _, minted = await post(http, admin + "/keys", {"tenant": "team9"})
        postgres_server.stop()
        for _ in range(5):
            assert await call(one, minted["key"]) == 200
        status, body = await post(http, admin + "/keys", {"tenant": "team9"})
        assert status == 503 and body["error"]["code"] == "control_unavailable"
        postgres_server.start()
        status, _ = await post(http, admin + f"/keys/{minted['id']}/revoke")
        assert status == 200
        await until(lambda: _is(one, minted["key"], 401), what="the revocation after the outage")


async def _is(gw: Gateway, key: str, status: int) -> bool:
    return await call(gw, key) == status


async def _rolled_back(*gws: Gateway) -> bool:
    for gw in gws:
        if "kvfence_gateway_control_rollbacks_total 1.0" in await gw.metrics():
            return True
    return False
