"""The token buckets in Python (one gateway's workers, `local_limits`) and in Lua (every replica,
`limits` on Redis) are one rule: on random schedules of admissions and releases, on the same
clock, both admit and refuse the same requests, for the same reason and the same wait. Redis's
clock is the one thing replaced: the scripts read `now` from their arguments here."""

from __future__ import annotations

import tempfile
from collections import deque
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.fleet.limits import _ADMIT, _RELEASE, admit_args
from gateway.fleet.local_limits import SharedLimits
from gateway.policy.tenant_model import TenantLimits
from tests.kit.redis_server import RedisServer

START = 1_000_000.0
LEASE_S = 3600.0  # longer than any schedule: no in-flight entry expires mid-run
_CLOCK = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) + tonumber(t[2]) / 1000000"


def _on_our_clock(admit: str, release: str) -> tuple[str, str]:
    """The two scripts with `now` taken from their last argument instead of Redis's TIME."""
    assert admit.count(_CLOCK) == 1 and release.count("redis.call('TIME')") == 1
    admit = admit.replace(_CLOCK, "local now = tonumber(ARGV[7])")
    release = release.replace("local t = redis.call('TIME')", "local t = {ARGV[4]}")
    return admit, release


limits_st = st.builds(
    TenantLimits,
    requests_per_s=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]),
    burst=st.sampled_from([0.0, 1.0, 2.0, 3.0]),
    concurrent=st.sampled_from([0, 1, 2, 3]),
    tokens_per_min=st.sampled_from([0, 60, 120, 600]),
)
# (seconds since the last step, in eighths; tokens to release, or None to ask for an admission)
step_st = st.tuples(st.integers(0, 24), st.one_of(st.none(), st.sampled_from([0, 10, 50, 100])))


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_server.url) as found:
        yield found


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(limits=limits_st, schedule=st.lists(step_st, min_size=1, max_size=30))
def test_python_and_lua_buckets_agree(
    client: redis.Redis, limits: TenantLimits, schedule: list[tuple[int, int | None]]
) -> None:
    client.flushall()
    admit_src, release_src = _on_our_clock(_ADMIT, _RELEASE)
    admit, release = client.register_script(admit_src), client.register_script(release_src)
    keys = ["bucket", "flight"]
    with tempfile.TemporaryDirectory() as folder:
        local = SharedLimits(Path(folder) / "limits.bin", generation=1.0)
        try:
            now, held, n = Fraction(START), deque[str](), 0
            for eighths, tokens in schedule:
                now += Fraction(eighths, 8)
                at = float(now)
                if tokens is not None:  # the oldest request in flight ends, charging `tokens`
                    if not held:
                        continue
                    local.release("acme", tokens, now=at)
                    release(keys=keys, args=[held.popleft(), tokens, limits.tokens_per_min, at])
                    continue
                n += 1
                token = f"t{n}"
                refusal = local.admit("acme", limits, now=at)
                reason, wait = admit(keys=keys, args=[*admit_args(limits, token, LEASE_S), at])
                lua = (reason.decode(), float(wait))
                assert lua[0] == ("" if refusal is None else refusal.reason), (n, limits)
                if refusal is None:
                    held.append(token)
                else:
                    assert lua[1] == pytest.approx(refusal.retry_after_s, rel=1e-9, abs=1e-9)
        finally:
            local.close()
