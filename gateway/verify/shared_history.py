"""The detective's history in the Redis the gateway replicas share (policy `gateway.shared`), so
a prompt one replica forwarded explains a hit another replica judges: per tenant and prefix key
a hash of the namespaces that recorded it, each value sealed (`gateway.fleet.sealed`) and
holding the recording request's nonce; per tenant a sorted set of its records by time, trimmed
to `history.tenant_cap` (the oldest go first, and their time moves the tenant's reach); the
tenants' reach in one hash, sealed. Plain commands and WATCH/MULTI only: no script.

Invariant: a value counts only when its seal verifies for its key and field; a missing,
expired, moved, forged or wrongly typed one is no record, so it never makes a hit the
namespace's own (and never names another namespace); a tenant's records are trimmed only by
its own cap, never for another tenant; key names are HMACs, never a tenant id or a prefix key
in the clear; a replica that cannot reach Redis records nothing and judges `unexplained`, never
`violation`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, Final, cast

import orjson
from redis.asyncio.client import Pipeline
from redis.exceptions import WatchError

from gateway.fleet.sealed import Sealer
from gateway.fleet.store import SharedStore, typed, wrong_type
from gateway.policy.model import HistorySettings
from gateway.verify.history import Presence, Reach, Recorder

TTL_MS: Final = 7 * 86400 * 1000  # a record nobody refreshed for this long is gone (cap aside)
TRIM_TRIES: Final = 8  # a trim that loses this many races is left to the tenant's next record


def _results(got: list[Any], what: str, store: SharedStore) -> list[Any]:
    """A pipeline's results with each WRONGTYPE answer counted and read as None (no record);
    any other error is raised (the store counts it)."""
    out = []
    for item in got:
        if isinstance(item, Exception):
            if not wrong_type(item):
                raise item
            store.metrics.shared_refused.labels(what, "invalid").inc()
            item = None
        out.append(item)
    return out


class SharedHistory:
    def __init__(self, store: SharedStore, secret: bytes, settings: HistorySettings) -> None:
        self.store, self.settings = store, settings
        self._sealer = Sealer(secret)
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
        zset = self._set(who.tenant)
        olds, size = await self.store.call(
            "history_record", self._write(zset, names, field, values, now)
        )
        over = size > self.settings.tenant_cap
        evicted = await self.store.call("history_record", self._trim(zset)) if over else 0.0
        if evicted or who.tenant not in self._known:
            await self._note(who.tenant, now, evicted)
        return [self._valid(n, field, old) is not None for n, old in zip(names, olds, strict=True)]

    def _queue(self, pipe: Pipeline, zset: str, names: Sequence[str], field: str,
               values: Sequence[bytes], now: float) -> None:  # fmt: skip
        for name, value in zip(names, values, strict=True):
            pipe.hset(name, field, value)
            pipe.pexpire(name, TTL_MS)
        pipe.zadd(zset, {f"{name}|{field}": now for name in names})
        pipe.pexpire(zset, TTL_MS)
        pipe.zcard(zset)

    async def _write(self, zset: str, names: Sequence[str], field: str, values: Sequence[bytes],
                     now: float) -> tuple[list[Any], int]:  # fmt: skip
        """Each hash's old value of the field, and the tenant's record count after the new
        values and index are written, in one transaction. A key of another type holds no
        record: it is replaced, and written again."""
        pipe = self.store.client.pipeline(transaction=True)
        for name in names:
            pipe.hget(name, field)
        self._queue(pipe, zset, names, field, values, now)
        got = await pipe.execute(raise_on_error=False)
        olds = _results(got[: len(names)], "history", self.store)
        writes = got[len(names) :]
        bad = {n for i, n in enumerate(names) if isinstance(writes[2 * i], Exception)}
        if isinstance(writes[-3], Exception):
            bad.add(zset)
        _results(writes, "history", self.store)
        if bad:
            again = self.store.client.pipeline(transaction=True)
            again.delete(*bad)
            self._queue(again, zset, names, field, values, now)
            writes = (await again.execute())[1:]
        return olds, int(writes[-1])

    async def _trim(self, zset: str) -> float:
        """Drop the tenant's oldest records beyond its cap; the newest time dropped (0: none).
        Only records of this tenant's own set are ever dropped."""
        cap = self.settings.tenant_cap
        async with self.store.client.pipeline(transaction=True) as pipe:
            for _ in range(TRIM_TRIES):
                try:
                    await pipe.watch(zset)
                    over = int(await typed(pipe.zcard(zset), 0)) - cap
                    if over <= 0:
                        return 0.0
                    gone = cast(
                        list[tuple[bytes, float]],
                        await pipe.zrange(zset, 0, over - 1, withscores=True),
                    )
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.zrem(zset, *[member for member, _ in gone])
                    for member, _ in gone:
                        name, _, field = member.partition(b"|")
                        pipe.hdel(name, field)
                    _results(await pipe.execute(raise_on_error=False), "history", self.store)
                except WatchError:
                    continue  # another record of this tenant changed the set: read it again
                times = [float(at) for _, at in gone if math.isfinite(float(at))]
                return min(max(times, default=0.0), time.time())
        return 0.0

    async def _note(self, tenant: int, now: float, evicted: float) -> None:
        """The tenant's reach: when its records began here and the newest one its cap evicted."""
        field = f"{tenant:x}"
        client = self.store.client
        raw = await self.store.call("history_reach", typed(client.hget(self._reach, field), b""))
        found = self._valid(self._reach, field, raw)
        reach = None if found is None else _reach_row(found)
        if raw is not None and reach is None:
            self.store.metrics.shared_refused.labels("history", "invalid").inc()
        claimed, newest = (now, 0.0) if reach is None else reach
        if reach is not None and not evicted:
            self._known.add(tenant)
            return
        value = orjson.dumps([claimed, max(newest, evicted)])
        sealed = self._sealer.seal(self._reach, field, value, now=now)
        await self.store.call("history_reach", self._put_reach(field, sealed))
        self._known.add(tenant)

    async def _put_reach(self, field: str, sealed: bytes) -> None:
        pipe = self.store.client.pipeline(transaction=True)
        pipe.hset(self._reach, field, sealed)
        if not isinstance((await pipe.execute(raise_on_error=False))[0], Exception):
            return
        # Not a hash: it holds no tenant's reach. Replaced; every tenant notes its own again.
        self.store.metrics.shared_refused.labels("history", "invalid").inc()
        self._known.clear()
        again = self.store.client.pipeline(transaction=True)
        again.delete(self._reach)
        again.hset(self._reach, field, sealed)
        await again.execute()

    async def _tenants(self) -> list[int]:
        """The tenants with a reach entry (a field that is not a tenant tag names none)."""
        fields = await self.store.call(
            "history_reach", typed(self.store.client.hkeys(self._reach), [])
        )
        return [tag for tag in map(_tag, fields) if tag]

    async def presence(
        self, who: Recorder, keys: Sequence[int], nonce: int, before: Sequence[bool]
    ) -> list[Presence]:
        # The asking tenant's own records count even while its reach entry is missing.
        tenants = sorted({*await self._tenants(), who.tenant})
        pipe = self.store.client.pipeline(transaction=False)
        for key in keys:
            for tenant in tenants:
                pipe.hgetall(self._hash(tenant, key))
        got = await self.store.call("history_presence", pipe.execute(raise_on_error=False))
        rows = iter(_results(got, "history", self.store))
        mine = f"{who.namespace:x}"
        out = []
        for key, was in zip(keys, before, strict=True):
            own, other = was, 0
            for tenant in tenants:
                name = self._hash(tenant, key)
                for raw_field, raw in (next(rows) or {}).items():
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
        raw = await self.store.call(
            "history_reach", typed(self.store.client.hgetall(self._reach), {})
        )
        rows = []
        for raw_field, value in raw.items():
            field = raw_field.decode() if isinstance(raw_field, bytes) else raw_field
            found = self._valid(self._reach, field, value)
            row = None if found is None else _reach_row(found)
            if row is not None and _tag(raw_field):
                rows.append((_tag(raw_field), *row))
        # A tenant whose entry is gone or unreadable notes it again on its next record.
        self._known &= {tenant for tenant, _, _ in rows}
        pipe = self.store.client.pipeline(transaction=False)
        for tenant, _, _ in rows:
            pipe.zcard(self._set(tenant))
        got = await self.store.call("history_reach", pipe.execute(raise_on_error=False))
        counts = _results(got, "history", self.store) if rows else []
        cap = self.settings.tenant_cap
        return [
            Reach(tenant, int(n or 0), cap, max(claimed, evicted), evicted > 0)
            for (tenant, claimed, evicted), n in zip(rows, counts, strict=True)
        ]

    def close(self) -> None:
        """The store is closed with the app's shared state."""


def _tag(field: bytes | str) -> int:
    """A reach field's tenant tag (0: not one)."""
    text = field.decode(errors="replace") if isinstance(field, bytes) else field
    try:
        return int(text, 16) if 0 < len(text) <= 16 else 0
    except ValueError:
        return 0


def _reach_row(value: bytes) -> tuple[float, float] | None:
    """(claimed, newest evicted) from a reach value; None when it is not that shape."""
    try:
        claimed, evicted = (float(v) for v in orjson.loads(value))
    except (orjson.JSONDecodeError, TypeError, ValueError):
        return None
    return claimed, evicted
