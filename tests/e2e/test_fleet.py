"""The fleet end to end: two of our backends (the real SmolLM2, small KV pools) behind two
gateway processes that share one real redis-server. A namespace stays on one backend and hits
through either gateway; a tenant's limit holds across both; a quarantine reaches both; losing
the backend that holds a namespace moves it with a clean verdict; Redis stopped gives 503
(on_failure: closed) until it is back."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from gateway.fleet.health import SharedHealthBoard
from gateway.fleet.local_health import Health
from gateway.fleet.metrics import FleetMetrics
from gateway.fleet.store import SharedStore
from gateway.metrics import Metrics
from gateway.policy.load import load_policy
from tests.kit.fleet_processes import (
    Backend,
    GatewayReplica,
    fleet_policy,
    gateway_replicas,
    new_replica,
    start_backend,
    wait_ready,
)
from tests.kit.polling import until
from tests.kit.redis_server import RedisServer, free_port, need_redis
from tests.kit.stack import Keys, make_keys

pytestmark = pytest.mark.slow
PROMPT = " ".join(f"Fact {i}: the fleet keeps each namespace on one replica." for i in range(8))


@dataclass
class Fleet:
    keys: Keys
    redis: RedisServer
    backends: list[Backend]
    gateways: list[GatewayReplica]

    def served(self, tenant: str) -> Counter[str]:
        return sum((g.served(tenant) for g in self.gateways), Counter())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    need_redis()
    folder = tmp_path_factory.mktemp("fleet")
    keys = make_keys(folder)
    (folder / "redis").mkdir()
    redis = RedisServer(folder / "redis")
    backends = [Backend("backend-a", free_port()), Backend("backend-b", free_port())]
    with contextlib.ExitStack() as stack:
        redis.start()
        stack.callback(redis.stop)
        for backend in backends:
            start_backend(backend, keys)
            stack.callback(backend.stop)
        wait_ready(backends)
        replicas = [new_replica(folder), new_replica(folder)]
        for replica in replicas:
            fleet_policy(keys, replica, backends, redis.url)
        with gateway_replicas(replicas):
            yield Fleet(keys, redis, backends, replicas)


async def chat(
    fleet: Fleet, gateway: int, tenant: str, user: str = "", prompt: str = PROMPT
) -> tuple[int, dict[str, Any], str]:
    body: dict[str, Any] = {"model": "smollm2", "max_tokens": 2, "temperature": 0,
                            "messages": [{"role": "user", "content": prompt}]}  # fmt: skip
    if user:
        body["user"] = user
    headers = {"authorization": f"Bearer {fleet.keys.api_keys[tenant]}"}
    async with aiohttp.ClientSession() as http:
        url = fleet.gateways[gateway].url + "/v1/chat/completions"
        async with http.post(url, json=body, headers=headers) as resp:
            return resp.status, await resp.json(), resp.headers.get("x-kvfence-verdict", "")


def cached(answer: dict[str, Any]) -> int:
    return int(answer["usage"]["prompt_tokens_details"]["cached_tokens"])


async def test_a_namespace_stays_on_one_backend_and_hits_through_either_gateway(
    fleet: Fleet,
) -> None:
    before = fleet.served("acme")
    hits = []
    for gateway in (0, 1, 0, 1):
        status, answer, verdict = await chat(fleet, gateway, "acme", "affine")
        assert (status, verdict) == (200, "clean")
        hits.append(cached(answer))
    assert hits[0] == 0 and all(h > 0 for h in hits[1:]), hits
    moved = fleet.served("acme") - before
    assert len(moved) == 1 and sum(moved.values()) == 4, moved


async def test_a_tenant_over_its_limit_gets_429_from_either_gateway(fleet: Fleet) -> None:
    short = "Say hi."
    assert (await chat(fleet, 0, "globex", prompt=short))[0] == 200
    assert (await chat(fleet, 1, "globex", prompt=short))[0] == 200  # burst: 2, in all
    for gateway in (0, 1):
        status, answer, _ = await chat(fleet, gateway, "globex", prompt=short)
        assert status == 429 and answer["error"]["code"] == "rate_limit_exceeded"


@contextlib.asynccontextmanager
async def shared_board(fleet: Fleet) -> Any:
    """The shared health board as a third replica sees it (the same Redis, the same key)."""
    policy = load_policy(fleet.gateways[0].policy)
    assert policy.gateway.shared is not None
    store = SharedStore(policy.gateway.shared, policy, FleetMetrics(Metrics()))
    try:
        names = [b.name for b in policy.backends]
        yield SharedHealthBoard(fleet.keys.folder / "unused-health.json", store, lambda: names)
    finally:
        await store.close()


def quarantined_everywhere(fleet: Fleet, name: str, value: bool) -> bool:
    return all(g.status()["backends"][name]["quarantined"] is value for g in fleet.gateways)  # type: ignore[index]


async def test_a_quarantined_backend_receives_nothing_from_either_gateway(fleet: Fleet) -> None:
    async with shared_board(fleet) as board:
        await board.update(
            "backend-b",
            lambda h: dataclasses.replace(h, quarantined=True, quarantine_reason="test"),
        )
        try:
            await until(lambda: quarantined_everywhere(fleet, "backend-b", True), 5, "agreement")
            before = fleet.served("acme")
            for i in range(6):
                status, _, verdict = await chat(fleet, i % 2, "acme", f"q-{i}", "Hello there.")
                assert (status, verdict) == (200, "clean")
            moved = fleet.served("acme") - before
            assert moved == Counter({"backend-a": 6})
        finally:
            await board.update("backend-b", lambda h: Health())
    await until(lambda: quarantined_everywhere(fleet, "backend-b", False), 5, "release")


async def test_losing_the_backend_moves_its_namespace_with_a_clean_verdict(
    fleet: Fleet,
) -> None:
    before = fleet.served("acme")
    status, _, _ = await chat(fleet, 0, "acme", "mover")
    assert status == 200
    (holder,) = (fleet.served("acme") - before).keys()
    victim = next(b for b in fleet.backends if b.name == holder)
    await asyncio.to_thread(victim.stop)
    after = fleet.served("acme")
    for gateway in (1, 0):
        status, answer, verdict = await chat(fleet, gateway, "acme", "mover")
        assert (status, verdict) == (200, "clean"), answer
    moved = fleet.served("acme") - after
    assert holder not in moved and sum(moved.values()) == 2
    assert cached(answer) > 0, "the namespace's cache lives on the new backend now"


async def test_redis_stopped_answers_503_until_it_is_back(fleet: Fleet) -> None:
    await asyncio.to_thread(fleet.redis.stop)
    try:
        # Each gateway notices within its refresh interval (0.25 s) plus a command's deadline.
        await until(lambda: all(g.status()["shared"]["up"] is False for g in fleet.gateways),  # type: ignore[index]
                    5, "both gateways seeing Redis down")  # fmt: skip
        for gateway in (0, 1):
            status, answer, _ = await chat(fleet, gateway, "acme", "r", "Hello.")
            assert status == 503 and answer["error"]["code"] == "shared_state_unavailable"
    finally:
        await asyncio.to_thread(fleet.redis.start)

    async def serving(gateway: int) -> bool:
        return (await chat(fleet, gateway, "acme", "r", "Hello."))[0] == 200

    for gateway in (0, 1):
        await until(lambda gateway=gateway: serving(gateway), 10, "recovery")  # type: ignore[misc]
