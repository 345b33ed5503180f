"""An answer that ends normally without its usage is charged an estimate, plain or streamed:
a tenant's tokens-per-minute allowance is spent by it."""

from __future__ import annotations

import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway

MSG = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_answer_without_usage_spends_the_allowance(stream: bool) -> None:
    upstream = FakeUpstream(mode="no_usage")
    await upstream.start()
    text = policy_text(upstream.url).replace(
        "scope: tenant, models: [smollm2]}",
        "scope: tenant, models: [smollm2], limits: {tokens_per_min: 1}}",
        1,
    )
    gw, runner = await run_gateway(parse_policy(text, "p", env=ENV), upstream)
    body = {"model": "smollm2", "messages": MSG, "stream": stream}
    try:
        first = await gw.chat("acme", body)
        answer = await first.read()
        assert first.status == 200 and b"Hello" in answer and b'"usage"' not in answer
        second = await gw.chat("acme", body)
        await second.read()
        assert second.status == 429  # the first answer cost more than the minute's one token
    finally:
        await gw.session.close()
        await runner.cleanup()
        await upstream.close()
