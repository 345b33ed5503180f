"""Fair share: per-tenant limits (requests per second, in flight, tokens per minute) answer 429
with Retry-After and an OpenAI-style error, apply across workers, and never touch another
tenant; the in-flight cap answers 503 with Retry-After instead of dropping connections."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, policy_text, run_gateway
from tests.kit.polling import until

MSG = [{"role": "user", "content": "hi"}]


async def status(resp: aiohttp.ClientResponse) -> int:
    await resp.read()
    return resp.status


def limited(url: str, limits: str, extra: str = "") -> str:
    text = policy_text(url, extra=extra)
    return text.replace(
        "scope: tenant, models: [smollm2]}",
        f"scope: tenant, models: [smollm2], limits: {limits}}}",
        1,
    )


async def test_requests_per_second_answer_429_with_retry_after(upstream: FakeUpstream) -> None:
    policy = parse_policy(limited(upstream.url, "{requests_per_s: 1, burst: 2}"), "p", env=ENV)
    gw, runner = await run_gateway(policy, upstream)
    try:
        statuses = [
            (await gw.chat("acme", {"model": "smollm2", "messages": MSG})) for _ in range(3)
        ]
        assert [r.status for r in statuses] == [200, 200, 429]
        refused = statuses[-1]
        assert int(refused.headers["retry-after"]) >= 1
        error = (await refused.json())["error"]
        assert error["code"] == "rate_limit_exceeded" and "requests per s" in error["message"]
        other = await gw.chat("globex", {"model": "smollm2", "messages": MSG})
        assert await status(other) == 200  # another tenant is not touched
        for resp in statuses[:2]:
            await resp.read()
        assert len(upstream.received) == 3  # the refused request never went upstream
        assert 'kvfence_gateway_limited_total{reason="requests_per_s",tenant="acme"} 1.0' in (
            await gw.metrics()
        )
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_the_official_client_sees_a_rate_limit_error(upstream: FakeUpstream) -> None:
    policy = parse_policy(limited(upstream.url, "{requests_per_s: 0.01, burst: 1}"), "p", env=ENV)
    gw, runner = await run_gateway(policy, upstream)
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=KEYS["acme"], max_retries=0)
    try:
        await client.chat.completions.create(model="smollm2", messages=MSG)  # type: ignore[arg-type]
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model="smollm2", messages=MSG)  # type: ignore[arg-type]
    finally:
        await client.close()
        await gw.session.close()
        await runner.cleanup()


async def test_concurrent_requests_are_capped_per_tenant(tmp_path: Path) -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    policy = parse_policy(limited(upstream.url, "{concurrent: 2}"), "p", env=ENV)
    gw, runner = await run_gateway(policy, upstream)
    body = {"model": "smollm2", "messages": MSG, "stream": True}
    try:
        held = [await gw.chat("acme", body) for _ in range(2)]  # streams the upstream holds open
        third = await gw.chat("acme", body)
        assert [r.status for r in held] == [200, 200] and third.status == 429
        other = await gw.chat("globex", body)
        assert other.status == 200
        other.close()
        for resp in held:
            resp.close()

        async def admitted() -> bool:  # once the gateway has noticed the closed streams
            again = await gw.chat("acme", body)
            again.close()
            return again.status == 200

        await until(admitted, what="acme admitted again after closing its streams")
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()


async def test_tokens_per_minute_are_charged_from_usage(upstream: FakeUpstream) -> None:
    # The fake's answers report 15 tokens; a budget of 20 a minute takes two answers, not three.
    policy = parse_policy(limited(upstream.url, "{tokens_per_min: 20}"), "p", env=ENV)
    gw, runner = await run_gateway(policy, upstream)
    try:
        statuses = [
            await status(await gw.chat("acme", {"model": "smollm2", "messages": MSG}))
            for _ in range(3)
        ]
        assert statuses == [200, 200, 429]
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_workers_share_one_allowance(upstream: FakeUpstream, tmp_path: Path) -> None:
    text = limited(upstream.url, "{requests_per_s: 0.01, burst: 3}")
    apps = []
    for _ in range(2):  # two workers of one gateway start: one state dir, one generation
        policy = parse_policy(text, "p", env=ENV)
        apps.append(await run_gateway(policy, upstream, state_dir=tmp_path, generation=1.0))
    try:
        statuses = [
            await status(await apps[i % 2][0].chat("acme", {"model": "smollm2", "messages": MSG}))
            for i in range(5)
        ]
        assert statuses == [200, 200, 200, 429, 429]
    finally:
        for gw, runner in apps:
            await gw.session.close()
            await runner.cleanup()


async def test_the_in_flight_cap_answers_503_not_a_closed_connection() -> None:
    upstream = FakeUpstream(mode="hold")
    await upstream.start()
    text = policy_text(upstream.url).replace(
        "max_body_bytes: 65536", "max_body_bytes: 65536, max_in_flight: 2"
    )
    gw, runner = await run_gateway(parse_policy(text, "p", env=ENV), upstream)
    body = {"model": "smollm2", "messages": MSG, "stream": True}
    try:
        held = [await gw.chat(t, body) for t in ("acme", "globex")]
        refused = await gw.chat("acme", body)
        assert refused.status == 503 and refused.headers["retry-after"] == "1"
        assert (await refused.json())["error"]["code"] == "overloaded"
        for resp in held:
            resp.close()
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
