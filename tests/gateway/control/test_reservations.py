"""Budgets and tokens per minute hold under concurrency: 20 requests at once, in waves, against
an upstream that answers slowly in every framing a server uses (usage in a plain body or not at
all, a usage-only event, usage on the last chunk with choices, CRLF framing): each answer is
charged, and what was served passes the budget by at most one request's reservation."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.fleet.budgeter import BUDGETS
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway
from tests.kit.slow_upstream import FRAMINGS, SlowUpstream

BODY = {"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(params=FRAMINGS)
async def upstream(request: pytest.FixtureRequest) -> AsyncIterator[SlowUpstream]:
    up = SlowUpstream(request.param)
    await up.start()
    yield up
    await up.close()


async def waves(gw: Any, stream: bool, count: int = 6) -> tuple[list[int], float]:
    """Send waves of 20 requests at once until one is refused whole; the statuses and time."""
    statuses: list[int] = []
    started = time.monotonic()
    body = {**BODY, "stream": True} if stream else BODY
    url, headers = gw.url + "/v1/chat/completions", gw.auth("acme")
    # A connection per request: a loaded host can start the next wave on a pooled connection just
    # as the gateway closes it. The policies give a connection 10 s for its headers (the kit's
    # 0.5 s cut a fresh one whose request this loop, busy with 19 others, sent late: a reset).
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        for _ in range(count):
            wave = await asyncio.gather(
                *(http.post(url, json=body, headers=headers) for _ in range(20))
            )
            codes = [r.status for r in wave]
            for r in wave:
                await r.read()
            statuses += codes
            if 200 not in codes:
                break
    return statuses, time.monotonic() - started


def reservation() -> int:
    """The reservation of one request of `waves` (its body's bytes, at most, plus max_tokens)."""
    return len(orjson.dumps({**BODY, "stream": True, "stream_options": {}})) + 64 + 8


async def test_a_budget_is_passed_by_at_most_one_reservation_in_every_framing(
    upstream: SlowUpstream, tmp_path: Path
) -> None:
    text = policy_text(upstream.url, header_s=10).replace(
        "id: acme, ", "id: acme, budgets: {day: 60}, "
    )
    policy = parse_policy(text, "t.yaml", env=ENV)
    gw, runner = await run_gateway(policy, FakeUpstream(), state_dir=tmp_path)
    try:
        statuses, _ = await waves(gw, stream=upstream.framing.startswith("sse"))
        served = statuses.count(200)
        assert served >= 1 and statuses.count(429) >= 20
        assert set(statuses) <= {200, 429}
        spent = (await gw.app[BUDGETS].spent("tenant:acme"))["day"]
        assert spent > 0, f"{upstream.framing}: the answers were charged nothing"
        if "no_usage" not in upstream.framing:
            assert spent == 13 * served  # charged what the usage said
        assert spent <= 60 + reservation(), (upstream.framing, served, spent)
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_tokens_per_minute_hold_under_concurrency(tmp_path: Path) -> None:
    up = SlowUpstream("plain")
    await up.start()
    text = policy_text(up.url, header_s=10).replace(
        "id: acme, ", "id: acme, limits: {tokens_per_min: 60}, "
    )
    policy = parse_policy(text, "t.yaml", env=ENV)
    gw, runner = await run_gateway(policy, FakeUpstream(), state_dir=tmp_path)
    try:
        statuses, elapsed = await waves(gw, stream=False, count=3)
        used = 13 * statuses.count(200)
        refill = elapsed * 60 / 60.0 + 1  # the bucket refills at a token a second meanwhile
        assert 0 < used <= 60 + reservation() + refill, (statuses.count(200), elapsed)
        assert statuses.count(429) >= 19
    finally:
        await gw.session.close()
        await runner.cleanup()
        await up.close()
