"""Per-tenant limits held in Redis, so every gateway replica (and every worker of each) gives a
tenant one allowance: the same token buckets and in-flight count as `local_limits`, each
admission one atomic script run on Redis's clock.

Invariant: an admission is one script (read, refill, decide, take) on the server, so replicas
never take the same allowance twice; an in-flight entry carries a lease (`shared.redis.lease_s`),
so a replica that dies mid-request does not hold the tenant's slot for ever.
"""

from __future__ import annotations

import os
from typing import Final

from gateway.fleet.local_limits import Refusal
from gateway.fleet.store import SharedStore
from gateway.policy.tenant_model import TenantLimits

# KEYS: bucket hash, in-flight sorted set. ARGV: rps, burst, concurrent, tpm, token, lease_s.
_ADMIT: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rps, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local conc, tpm, lease = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[6])
local h = redis.call('HMGET', KEYS[1], 'r', 'rt', 'k', 'kt')
local r, k = burst, tpm
if h[1] then r = math.min(burst, tonumber(h[1]) + math.max(0, now - tonumber(h[2])) * rps) end
if h[3] then k = math.min(tpm, tonumber(h[3]) + math.max(0, now - tonumber(h[4])) * tpm / 60) end
local flight = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  flight = redis.call('ZCARD', KEYS[2])
end
local reason, wait = '', 0
if conc > 0 and flight >= conc then reason, wait = 'concurrent', 1
elseif rps > 0 and r < 1 then reason, wait = 'requests_per_s', (1 - r) / rps
elseif tpm > 0 and k <= 0 then reason, wait = 'tokens_per_min', -k / (tpm / 60) + 0.001
end
if reason == '' then
  r = r - 1
  if conc > 0 then
    redis.call('ZADD', KEYS[2], now + lease, ARGV[5])
    redis.call('EXPIRE', KEYS[2], math.ceil(lease) + 1)
  end
end
redis.call('HSET', KEYS[1], 'r', tostring(r), 'rt', tostring(now), 'k', tostring(k),
  'kt', tostring(now))
redis.call('EXPIRE', KEYS[1], 86400)
return {reason, tostring(wait)}
"""

# KEYS: bucket hash, in-flight sorted set. ARGV: token, tokens used, tpm.
_RELEASE: Final = """
redis.call('ZREM', KEYS[2], ARGV[1])
local used, tpm = tonumber(ARGV[2]), tonumber(ARGV[3])
if used > 0 and tpm > 0 then
  if redis.call('HEXISTS', KEYS[1], 'k') == 1 then
    redis.call('HINCRBYFLOAT', KEYS[1], 'k', -used)
  else
    local t = redis.call('TIME')
    redis.call('HSET', KEYS[1], 'k', tostring(tpm - used), 'kt', t[1])
  end
end
return 1
"""


def admit_args(limits: TenantLimits, token: str, lease_s: float) -> list[str | float]:
    """`_ADMIT`'s ARGV for one request under `limits` (a tenant without a rate has no burst)."""
    burst = limits.burst if limits.requests_per_s else 1e18
    return [limits.requests_per_s, burst, limits.concurrent, limits.tokens_per_min, token, lease_s]


class RedisLimits:
    def __init__(self, store: SharedStore) -> None:
        self.store = store
        self._admit = store.client.register_script(_ADMIT)
        self._release = store.client.register_script(_RELEASE)

    def _keys(self, tenant: str) -> list[str]:
        return [self.store.key("bucket", tenant), self.store.key("flight", tenant)]

    async def admit(self, tenant: str, limits: TenantLimits) -> tuple[str, Refusal | None]:
        """Take one request's allowance: (its lease token, None), or (_, why not). Raises
        `SharedUnavailable` when Redis cannot answer."""
        token = os.urandom(12).hex()
        args = admit_args(limits, token, self.store.settings.lease_s)
        reason, wait = await self.store.call(
            "admit", self._admit(keys=self._keys(tenant), args=args)
        )
        if not reason:
            return token, None
        return token, Refusal(_text(reason), float(_text(wait)))

    async def release(self, tenant: str, token: str, tokens: int, limits: TenantLimits) -> None:
        args: list[str | int] = [token, tokens, limits.tokens_per_min]
        await self.store.call("release", self._release(keys=self._keys(tenant), args=args))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
