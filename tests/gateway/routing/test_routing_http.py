"""A model with two backends behind the real gateway (fake upstreams on port 0): affinity keeps
a namespace on one backend, a failure before the answer moves to the other, repeated failures
eject a backend, and a quarantined backend gets nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.policy.load import parse_policy
from gateway.routing.replicas import REPLICAS
from gateway.server import bound_port, start_admin
from gateway.verify.watch import WATCH
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, Gateway, run_gateway

USERS = [f"user-{i}" for i in range(12)]


@pytest.fixture
async def pair() -> AsyncIterator[tuple[FakeUpstream, FakeUpstream]]:
    a, b = FakeUpstream(), FakeUpstream()
    await a.start()
    await b.start()
    yield a, b
    await a.close()
    await b.close()


async def gateway_for(
    pair: tuple[FakeUpstream, FakeUpstream], routing: str = ""
) -> AsyncIterator[Gateway]:
    a, b = pair
    text = fleet_policy_text(replica("a", a.url), replica("b", b.url), gateway=routing)
    gateway, runner = await run_gateway(parse_policy(text, "p.yaml", env=ENV), a)
    try:
        yield gateway
    finally:
        await gateway.session.close()
        await runner.cleanup()


@pytest.fixture
async def gw2(pair: tuple[FakeUpstream, FakeUpstream]) -> AsyncIterator[Gateway]:
    async for gateway in gateway_for(pair, "  routing: {eject_after_errors: 2, eject_for_s: 60}\n"):
        yield gateway


async def ask(gw: Gateway, user: str) -> int:
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
    resp = await gw.chat("initech", body, **{"x-end-user": user})
    await resp.read()
    return resp.status


def salts(upstream: FakeUpstream) -> set[str]:
    return {orjson.loads(r.body)["cache_salt"] for r in upstream.received}


async def test_each_namespace_stays_on_one_backend_and_both_get_some(
    gw2: Gateway, pair: tuple[FakeUpstream, FakeUpstream]
) -> None:
    a, b = pair
    for _ in range(3):
        for user in USERS:
            assert await ask(gw2, user) == 200
    assert salts(a) and salts(b), "affinity should still spread namespaces"
    assert not salts(a) & salts(b), "a namespace was sent to both backends"


async def test_round_robin_spreads_one_namespace_over_both(
    pair: tuple[FakeUpstream, FakeUpstream],
) -> None:
    async for gw in gateway_for(pair, "  routing: {strategy: round_robin}\n"):
        for _ in range(4):
            assert await ask(gw, "one-user") == 200
    assert len(pair[0].received) == len(pair[1].received) == 2


async def test_a_dead_backend_is_retried_elsewhere_then_ejected(
    gw2: Gateway, pair: tuple[FakeUpstream, FakeUpstream]
) -> None:
    a, b = pair
    for user in USERS:
        assert await ask(gw2, user) == 200
    assert salts(a), "some namespaces live on a"
    a.mode = "die_before"
    a.received.clear()
    b.received.clear()
    for user in USERS:
        assert await ask(gw2, user) == 200  # every answer still arrives, through b
    assert len(a.received) == 2, "after two errors in a row, a is ejected"
    assert len(b.received) == len(USERS)
    assert gw2.app[REPLICAS].ejected("a")
    metrics = await gw2.metrics()
    assert 'kvfence_gateway_retries_total{backend="a"} 2.0' in metrics
    assert 'kvfence_gateway_ejections_total{backend="a"} 1.0' in metrics
    runner = await start_admin(gw2.app, "127.0.0.1", 0)
    try:
        async with gw2.session.get(f"http://127.0.0.1:{bound_port(runner)}/status") as resp:
            backends = (await resp.json())["backends"]
    finally:
        await runner.cleanup()
    assert backends["a"]["passive"]["ejections"] == 1
    assert 55 < backends["a"]["passive"]["ejected_for_s"] <= 60
    assert backends["b"]["passive"] == {"consecutive_errors": 0, "ejected_for_s": 0.0,
                                        "ejections": 0}  # fmt: skip
    assert backends["a"]["weight"] == backends["b"]["weight"] == 1.0


async def test_a_quarantined_backend_receives_nothing(
    gw2: Gateway, pair: tuple[FakeUpstream, FakeUpstream]
) -> None:
    a, b = pair
    await gw2.app[WATCH].apply("a", lambda h: dataclasses.replace(h, quarantined=True))
    for user in USERS:
        assert await ask(gw2, user) == 200
    assert a.received == [] and len(b.received) == len(USERS)
    await gw2.app[WATCH].apply("b", lambda h: dataclasses.replace(h, quarantined=True))
    resp = await gw2.chat("initech", {"model": "smollm2", "messages": []}, **{"x-end-user": "x"})
    assert resp.status == 503
    assert (await resp.json())["error"]["code"] == "backend_quarantined"


async def test_a_stream_cut_after_its_first_byte_is_not_retried(
    gw2: Gateway, pair: tuple[FakeUpstream, FakeUpstream]
) -> None:
    a, b = pair
    a.mode = b.mode = "die_mid"
    body = {"model": "smollm2", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    resp = await gw2.chat("initech", body, **{"x-end-user": "streamer"})
    assert resp.status == 200  # the stream had begun: the client sees it end, not a retry
    await resp.read()
    assert len(a.received) + len(b.received) == 1
