"""Fixtures for the gateway's tests: a fake upstream and the real gateway in front of it (the
stack itself is `tests.kit.gateway`, which the benchmarks start too)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.openai_upstream import FakeUpstream

# listener/test_floods.py and filters/test_fair_share.py take ENV, KEYS, policy_text and
# run_gateway from here: the kit's own.
from tests.kit.gateway import ENV, KEYS, Gateway, make_policy, policy_text, run_gateway

__all__ = ["ENV", "KEYS", "Gateway", "gw", "make_policy", "policy_text", "run_gateway", "upstream"]


@pytest.fixture
async def upstream() -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream()
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    gateway, runner = await run_gateway(make_policy(upstream.url), upstream)
    yield gateway
    await gateway.session.close()
    await runner.cleanup()
