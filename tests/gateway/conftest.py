"""Fixtures for the gateway's tests: a fake upstream and the real gateway in front of it (the
stack itself is `tests.kit.gateway`, which the benchmarks start too)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import QUICK_TIMEOUTS, Gateway, make_policy, run_gateway


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


@pytest.fixture
async def quick_gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """`gw` with upstream deadlines of 1 s, for a test of a deadline."""
    policy = make_policy(upstream.url, timeouts=QUICK_TIMEOUTS)
    gateway, runner = await run_gateway(policy, upstream)
    yield gateway
    await gateway.session.close()
    await runner.cleanup()
