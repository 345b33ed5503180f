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

import orjson
import pytest
from aiohttp import web

from gateway.fleet.budgeter import BUDGETS
from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway

USAGE = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
FRAMINGS = ("plain", "plain_no_usage", "sse_usage_event", "sse_usage_last_chunk", "sse_crlf",
            "sse_no_usage")  # fmt: skip
BODY = {"model": "smollm2", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _chunk(text: str, usage: dict[str, int] | None = None, finish: str | None = None) -> bytes:
    doc: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "smollm2",
                           "choices": [{"index": 0, "delta": {"content": text},
                                        "finish_reason": finish}]}  # fmt: skip
    if usage is not None:
        doc["usage"] = usage
    return orjson.dumps(doc)


def events(framing: str) -> bytes:
    end = b"\r\n\r\n" if framing == "sse_crlf" else b"\n\n"
    out = [_chunk("Hello"), _chunk(" there")]
    if framing == "sse_usage_last_chunk":
        out.append(_chunk("!", USAGE, "stop"))
    else:
        out.append(_chunk("!", None, "stop"))
    if framing in ("sse_usage_event", "sse_crlf"):
        out.append(orjson.dumps({"id": "c1", "object": "chat.completion.chunk", "choices": [],
                                 "usage": USAGE}))  # fmt: skip
    return b"".join(b"data: " + e + end for e in [*out, b"[DONE]"])


class SlowUpstream:
    """Answers after `delay_s`, so the requests of a wave are in flight together."""

    def __init__(self, framing: str, delay_s: float = 0.3) -> None:
        self.framing, self.delay_s, self.url = framing, delay_s, ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method == "GET":
            return web.Response()
        await request.read()
        await asyncio.sleep(self.delay_s)
        if self.framing.startswith("plain"):
            message = {"role": "assistant", "content": "Hello there!"}
            choice = {"index": 0, "finish_reason": "stop", "message": message}
            doc: dict[str, Any] = {"id": "c1", "object": "chat.completion", "model": "smollm2",
                                   "choices": [choice]}  # fmt: skip
            if self.framing == "plain":
                doc["usage"] = USAGE
            return web.json_response(doc)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(events(self.framing))
        await resp.write_eof()
        return resp

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


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
    for _ in range(count):
        wave = await asyncio.gather(*(gw.chat("acme", body) for _ in range(20)))
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
    text = policy_text(upstream.url).replace("id: acme, ", "id: acme, budgets: {day: 60}, ")
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
    text = policy_text(up.url).replace("id: acme, ", "id: acme, limits: {tokens_per_min: 60}, ")
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
