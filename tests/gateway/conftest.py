"""Fixtures for the gateway's tests: a fake upstream and the real gateway in front of it (the
stack itself is `tests.kit.gateway`, which the benchmarks start too)."""

from __future__ import annotations

import contextlib
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


@contextlib.asynccontextmanager
async def _gateway(upstream: FakeUpstream, **policy: str) -> AsyncIterator[Gateway]:
    gateway, runner = await run_gateway(make_policy(upstream.url, **policy), upstream)
    try:
        yield gateway
    finally:
        await gateway.session.close()
        await runner.cleanup()


@pytest.fixture
async def gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    async with _gateway(upstream) as gateway:
        yield gateway


@pytest.fixture
async def quick_gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    """`gw` with upstream deadlines of 1 s, for a test of a deadline."""
    async with _gateway(upstream, timeouts=QUICK_TIMEOUTS) as gateway:
        yield gateway
