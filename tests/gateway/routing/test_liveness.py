"""What an operator sees while a backend is down: `/readyz` answers 503 until it is back, the
admin `/status` names the backend and why its health check failed, `/metrics` says
`backend_up 0`, and each 502 leaves one log line naming the URL and what failed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest

from gateway.policy.load import parse_policy
from gateway.routing.liveness import LIVENESS
from gateway.server import bound_port, start_admin
from kvfence.logs import JsonFormatter
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, make_policy, policy_text, run_gateway
from tests.kit.polling import until

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def admin(gw: Gateway) -> AsyncIterator[str]:
    runner = await start_admin(gw.app, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{bound_port(runner)}"
    await runner.cleanup()


async def _ready(gw: Gateway) -> int:
    async with gw.session.get(gw.url + "/readyz") as resp:
        return resp.status


async def _status(gw: Gateway, admin: str) -> dict[str, object]:
    async with gw.session.get(admin + "/status") as resp:
        data: dict[str, object] = await resp.json()
        return data


async def test_readyz_follows_the_backends_health(gw: Gateway, admin: str) -> None:
    assert await _ready(gw) == 200
    gw.upstream.unhealthy = True
    await until(lambda: _not(gw), 15, "/readyz answering 503")
    resp = await gw.session.get(gw.url + "/readyz")
    error = (await resp.json())["error"]
    # The tenant port says only that it is not ready; the admin listener says which and why.
    assert error["code"] == "not_ready" and "fake-vllm" not in error["message"]
    status = await _status(gw, admin)
    assert status["ready"] is False and status["down"] == ["fake-vllm"]
    backend = status["backends"]["fake-vllm"]  # type: ignore[index]
    assert backend["up"] is False
    assert backend["health_check"]["error"] == "answered 503"
    assert backend["health_check"]["url"] == gw.upstream.url + "/health"
    metrics = await (await gw.session.get(admin + "/metrics")).text()
    assert 'kvfence_gateway_backend_up{backend="fake-vllm"} 0.0' in metrics
    assert "kvfence_gateway_ready 0.0" in metrics
    assert "kvfence_gateway_requests_total{" not in metrics  # probes do not count as requests
    gw.upstream.unhealthy = False
    await until(lambda: _is(gw, 200), 15, "/readyz answering 200 again")


async def _not(gw: Gateway) -> bool:
    return await _ready(gw) == 503


async def _is(gw: Gateway, status: int) -> bool:
    return await _ready(gw) == status


async def test_a_stopped_backend_is_down_and_its_502_names_the_cause(
    caplog: pytest.LogCaptureFixture,
) -> None:
    upstream = FakeUpstream()
    await upstream.start()
    gw, runner = await run_gateway(make_policy(upstream.url), upstream)
    try:
        assert await _ready(gw) == 200
        await upstream.close()  # nothing listens there any more
        caplog.set_level(logging.INFO, logger="kvfence")
        resp = await gw.chat("acme", {"model": "smollm2", "messages": MSG})
        assert resp.status == 502
        body = await resp.json()
        assert "refused" not in body["error"]["message"]  # the cause is for the operator
        await until(lambda: _not(gw), 15, "/readyz answering 503")
    finally:
        await gw.session.close()
        await runner.cleanup()
    lines = [orjson.loads(JsonFormatter().format(r)) for r in caplog.records]
    failed = [line for line in lines if line["msg"] == "upstream failed"]
    assert len(failed) == 1, lines
    assert failed[0]["url"] == upstream.url + "/v1/chat/completions"
    assert failed[0]["cause"].startswith("connection refused")
    down = [line for line in lines if line["msg"] == "backend down"]
    assert down and down[0]["backend"] == "fake-vllm" and "refused" in down[0]["error"]


async def test_an_optional_backend_does_not_hold_readiness(upstream: FakeUpstream) -> None:
    text = policy_text(upstream.url).replace(
        "tenants:",
        "  - {name: later, kind: vllm, url: 'http://127.0.0.1:9', required: false,\n"
        "     verify: {canary: false}, models: [{name: third, revision: '1'}]}\ntenants:",
    )
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    try:
        assert await _ready(gw) == 200  # after the first round of checks: `later` is down
        assert not gw.app[LIVENESS].get("later").up
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_a_slow_health_check_marks_down_only_on_its_second_miss(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A server busy generating can answer its health path late: one check without an answer
    leaves an up backend up; the next one without an answer marks it down; a refusal marks it
    down at once."""
    from aiohttp import web

    from gateway.routing import liveness as module

    monkeypatch.setattr(module, "TIMEOUT_S", 0.2)
    slow = {"on": False}

    async def health(_request: web.Request) -> web.Response:
        if slow["on"]:
            await asyncio.sleep(1)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    text = policy_text(f"http://127.0.0.1:{port}")
    backend = parse_policy(text, "t.yaml", env=ENV).backends[0]
    watch = module.Liveness()
    try:
        async with aiohttp.ClientSession() as session:
            await watch.check(session, backend)
            assert watch.get(backend.name).up is True
            slow["on"] = True
            await watch.check(session, backend)
            first = watch.get(backend.name)
            assert first.up is True and first.missed == 1 and first.error == "timed out"
            await watch.check(session, backend)
            assert watch.get(backend.name).up is False
            slow["on"] = False
            await watch.check(session, backend)
            assert watch.get(backend.name).up is True and watch.get(backend.name).missed == 0
            await runner.cleanup()  # nothing listens: refused, down at once
            await watch.check(session, backend)
            assert watch.get(backend.name).up is False
    finally:
        await runner.cleanup()
