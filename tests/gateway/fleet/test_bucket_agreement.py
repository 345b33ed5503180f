"""One gateway's limits table (`local_limits`, a memory-mapped file) and every replica's (`limits`,
sealed values in Redis) hold one rule: on random schedules of admissions and releases, on the
same clock, both admit and refuse the same requests, for the same reason and the same wait."""

from __future__ import annotations

import asyncio
import tempfile
from collections import deque
from fractions import Fraction
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.fleet.limits import RedisLimits
from gateway.fleet.local_limits import SharedLimits
from gateway.fleet.metrics import FleetMetrics
from gateway.fleet.store import SharedStore
from gateway.metrics import Metrics
from gateway.policy.load import parse_policy
from gateway.policy.tenant_model import TenantLimits
from tests.kit.gateway import ENV, policy_text
from tests.kit.redis_server import RedisServer

START = 1_000_000.0

limits_st = st.builds(
    TenantLimits,
    requests_per_s=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]),
    burst=st.sampled_from([0.0, 1.0, 2.0, 3.0]),
    concurrent=st.sampled_from([0, 1, 2, 3]),
    tokens_per_min=st.sampled_from([0, 60, 120, 600]),
)
# (seconds since the last step, in eighths; tokens to release, or None to ask for an admission)
step_st = st.tuples(st.integers(0, 24), st.one_of(st.none(), st.sampled_from([0, 10, 50, 100])))


async def _run(url: str, limits: TenantLimits, schedule: list[tuple[int, int | None]]) -> None:
    shared_text = f"access_log: false\n  shared: {{redis: {{url: '{url}'}}}}\n"
    text = policy_text("http://127.0.0.1:9").replace("access_log: false\n", shared_text)
    policy = parse_policy(text, "p.yaml", env=ENV)
    assert policy.gateway.shared is not None
    store = SharedStore(policy.gateway.shared, policy, FleetMetrics(Metrics()))
    now = Fraction(START)
    shared = RedisLimits(store, clock=lambda: float(now))
    with tempfile.TemporaryDirectory() as folder:
        local = SharedLimits(Path(folder) / "limits.bin", generation=1.0)
        try:
            held, n = deque[str](), 0
            for eighths, tokens in schedule:
                now += Fraction(eighths, 8)
                at = float(now)
                if tokens is not None:  # the oldest request in flight ends, charging `tokens`
                    if not held:
                        continue
                    local.release("acme", tokens, now=at)
                    await shared.release("acme", held.popleft(), tokens, limits)
                    continue
                n += 1
                refusal = local.admit("acme", limits, now=at)
                token, found = await shared.admit("acme", limits)
                assert (found and found.reason) == (refusal and refusal.reason), (n, limits)
                if refusal is None:
                    held.append(token)
                else:
                    assert found is not None
                    assert found.retry_after_s == pytest.approx(refusal.retry_after_s, rel=1e-9)
        finally:
            local.close()
            await store.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=limits_st, schedule=st.lists(step_st, min_size=1, max_size=30))
def test_the_local_and_the_shared_tables_agree(
    redis_server: RedisServer, limits: TenantLimits, schedule: list[tuple[int, int | None]]
) -> None:
    with redis.Redis.from_url(redis_server.url) as client:
        client.flushall()
    asyncio.run(_run(redis_server.url, limits, schedule))
