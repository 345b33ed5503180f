"""The detective's history in the Redis the gateway replicas share (policy `gateway.shared`), so
a prompt one replica forwarded explains a hit another replica judges: per tenant and prefix key
a hash of the namespaces that recorded it, each value sealed (`gateway.fleet.sealed`) and
holding the recording request's nonce; per tenant a sorted set of its records by time, trimmed
to `history.tenant_cap` (the oldest go first, and their time moves the tenant's reach); the
tenants' reach in one hash, sealed.

Invariant: a value counts only when its seal verifies for its key and field; a missing,
expired, moved or forged one is no record, so it never makes a hit the namespace's own (and
never names another namespace); key names are HMACs, never a tenant id or a prefix key in the
clear; a replica that cannot reach Redis records nothing and judges `unexplained`, never
`violation`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

import orjson

from gateway.fleet.sealed import Sealer
from gateway.fleet.store import SharedStore
from gateway.policy.model import HistorySettings
from gateway.verify.history import Presence, Reach, Recorder

TTL_S: Final = 7 * 86400  # a record nobody refreshed for this long is gone (cap aside)
# KEYS: the tenant's set, then one hash per prefix key; ARGV: field, now, cap, ttl (ms), then
# the sealed value for each hash. Returns each hash's old value of the field (false when none),
# then the newest time among the records the cap evicted ("0": none).
_RECORD: Final = """
local zset, field = KEYS[1], ARGV[1]
local now, cap, ttl = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 2, #KEYS do
  out[#out + 1] = redis.call('HGET', KEYS[i], field)
  redis.call('HSET', KEYS[i], field, ARGV[i + 3])
  redis.call('PEXPIRE', KEYS[i], ttl)
  redis.call('ZADD', zset, now, KEYS[i] .. '|' .. field)
end
redis.call('PEXPIRE', zset, ttl)
local evicted = 0
local over = redis.call('ZCARD', zset) - cap
if over > 0 then
  local gone = redis.call('ZPOPMIN', zset, over)
  for j = 1, #gone, 2 do
    local at = string.find(gone[j], '|', 1, true)
    redis.call('HDEL', string.sub(gone[j], 1, at - 1), string.sub(gone[j], at + 1))
    evicted = math.max(evicted, tonumber(gone[j + 1]))
  end
end
out[#out + 1] = tostring(evicted)
return out
"""


class SharedHistory:
    def __init__(self, store: SharedStore, secret: bytes, settings: HistorySettings) -> None:
        self.store, self.settings = store, settings
        self._sealer = Sealer(secret)
        self._record = store.client.register_script(_RECORD)
        self._reach = store.key("history-reach")
        self._known: set[int] = set()  # tenants whose reach entry this worker has seen

    def _hash(self, tenant: int, key: int) -> str:
        return self.store.key("history", f"{tenant:x}:{key:x}")

    def _set(self, tenant: int) -> str:
        return self.store.key("history-set", f"{tenant:x}")

    def _valid(self, name: str, field: str, raw: Any) -> bytes | None:
        raw = raw.encode() if isinstance(raw, str) else raw
        opened = self._sealer.open(name, field, raw if isinstance(raw, bytes) else None)
        return None if opened is None else opened.value

    async def record(self, who: Recorder, keys: Sequence[int], nonce: int) -> list[bool]:
        if not keys:
            return []
        now = time.time()
        field = f"{who.namespace:x}"
        names = [self._hash(who.tenant, k) for k in keys]
        # Each value is sealed for its own hash: moved to another, it no longer verifies.
        values = [self._sealer.seal(n, field, nonce.to_bytes(4, "big"), now=now) for n in names]
        got = await self.store.call(
            "history_record",
            self._record(
                keys=[self._set(who.tenant), *names],
                args=[field, now, self.settings.tenant_cap, TTL_S * 1000, *values],
            ),
        )
        olds, evicted = got[:-1], float(got[-1])
        if evicted or who.tenant not in self._known:
            await self._note(who.tenant, now, evicted)
        return [self._valid(n, field, old) is not None for n, old in zip(names, olds, strict=True)]

    async def _note(self, tenant: int, now: float, evicted: float) -> None:
        """The tenant's reach: when its records began here and the newest one its cap evicted."""
        field = f"{tenant:x}"
        raw = await self.store.call("history_reach", self.store.client.hget(self._reach, field))
        found = self._valid(self._reach, field, raw)
        claimed, newest = (now, 0.0) if found is None else tuple(orjson.loads(found))
        if found is not None and not evicted:
            self._known.add(tenant)
            return
        value = orjson.dumps([claimed, max(newest, evicted)])
        sealed = self._sealer.seal(self._reach, field, value, now=now)
        await self.store.call("history_reach", self.store.client.hset(self._reach, field, sealed))
        self._known.add(tenant)

    async def _tenants(self) -> list[int]:
        fields = await self.store.call("history_reach", self.store.client.hkeys(self._reach))
        return [int(f, 16) for f in fields]

    async def presence(
        self, who: Recorder, keys: Sequence[int], nonce: int, before: Sequence[bool]
    ) -> list[Presence]:
        tenants = await self._tenants()
        pipe = self.store.client.pipeline(transaction=False)
        for key in keys:
            for tenant in tenants:
                pipe.hgetall(self._hash(tenant, key))
        rows = iter(await self.store.call("history_presence", pipe.execute()))
        mine = f"{who.namespace:x}"
        out = []
        for key, was in zip(keys, before, strict=True):
            own, other = was, 0
            for tenant in tenants:
                name = self._hash(tenant, key)
                for raw_field, raw in next(rows).items():
                    field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
                    value = self._valid(name, field, raw)
                    if value is None:
                        continue  # no record: never own, never another's
                    if tenant == who.tenant and field == mine:
                        own = own or int.from_bytes(value, "big") != nonce
                    elif not other:
                        other = int(field, 16)
            out.append(Presence(own, other))
        return out

    async def reach(self) -> list[Reach]:
        raw = await self.store.call("history_reach", self.store.client.hgetall(self._reach))
        rows = []
        for raw_field, value in raw.items():
            field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
            found = self._valid(self._reach, field, value)
            if found is not None:
                claimed, evicted = orjson.loads(found)
                rows.append((int(field, 16), float(claimed), float(evicted)))
        pipe = self.store.client.pipeline(transaction=False)
        for tenant, _, _ in rows:
            pipe.zcard(self._set(tenant))
        counts = await self.store.call("history_reach", pipe.execute()) if rows else []
        cap = self.settings.tenant_cap
        return [
            Reach(tenant, int(n), cap, max(claimed, evicted), evicted > 0)
            for (tenant, claimed, evicted), n in zip(rows, counts, strict=True)
        ]

    def close(self) -> None:
        """The store is closed with the app's shared state."""
