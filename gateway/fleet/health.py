"""Per-backend verification state (quarantine, canary outcomes, violations) in the Redis the
gateway replicas share: one hash, a field per backend, re-read by every worker of every
replica every `REFRESH_S`, so replicas agree on a quarantine within that (plus a round trip).

Invariant: a change is a read-modify-write in one optimistic transaction (WATCH/MULTI), so
replicas never lose each other's updates; a change Redis could not take is still honoured by
this worker at once and applied to Redis when it is reachable again (fail closed: a quarantine
is never lost because Redis was down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import orjson
from redis.exceptions import WatchError

from gateway.fleet.local_health import REFRESH_S, Health, HealthBoard
from gateway.fleet.store import SharedStore
from gateway.fleet.unavailable import SharedUnavailable

log = logging.getLogger("kvfence.gateway.shared")
Change = Callable[[Health], Health]


def _decode(raw: bytes | str | None) -> tuple[str, Health] | None:
    if raw is None:
        return None
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("backend"), str):
        return None
    return data["backend"], Health.from_json(data.get("health"))


class SharedHealthBoard(HealthBoard):
    """A `HealthBoard` whose truth is in Redis; the file board underneath is not used."""

    def __init__(self, path: Path, store: SharedStore) -> None:
        super().__init__(path)
        self.view = {}
        self.store = store
        self._key = store.key("health")
        self._pending: list[tuple[str, Change]] = []

    def _load(self) -> None:
        """The file is not read: Redis holds the state (see `refresh`)."""

    async def refresh(self) -> None:
        """Re-read every backend's state; first apply changes Redis missed while down."""
        while self._pending:
            name, change = self._pending[0]
            await self.store.call("health_write", self._apply(name, change))
            self._pending.pop(0)
        raw = await self.store.call("health_read", self.store.client.hgetall(self._key))
        view = {}
        for value in raw.values():
            found = _decode(value)
            if found is not None:
                view[found[0]] = found[1]
        self.view = view

    async def watch(self) -> None:
        task = asyncio.current_task()
        while True:
            # A failure is counted and logged by the store; the last view (and pending) holds.
            with contextlib.suppress(SharedUnavailable):
                await self.refresh()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError  # a cancel the client absorbed: stop all the same
            await asyncio.sleep(REFRESH_S)

    async def _apply(self, name: str, change: Change) -> tuple[Health, Health]:
        field = self.store.key("backend", name)
        async with self.store.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self._key)
                    found = _decode(await pipe.hget(self._key, field))
                    before = found[1] if found else Health()
                    after = change(before)
                    value = orjson.dumps({"backend": name, "health": after.as_json()})
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(self._key, field, value)
                    await pipe.execute()
                    return before, after
                except WatchError:
                    continue  # another replica changed the board: read it again

    async def update(self, backend: str, change: Change) -> tuple[Health, Health]:
        try:
            before, after = await self.store.call("health_write", self._apply(backend, change))
        except SharedUnavailable:
            before = self.get(backend)
            after = change(before)
            self._pending.append((backend, change))
            log.warning("health change kept locally until the shared state is back",
                        extra={"backend": backend})  # fmt: skip
        self.view = {**self.view, backend: after}
        return before, after

    async def claim_round(self, backend: str, interval_s: float) -> bool:
        """One replica runs each due round: the first to set the round's key (it expires after
        most of an interval, so a replica that died mid-round does not stop the next one).
        Redis unreachable: run it here (a round too many is safe, a round too few is not)."""
        key = self.store.key("canary", backend)
        ttl_ms = max(1000, int(interval_s * 900))
        try:
            claimed = await self.store.call(
                "canary_claim", self.store.client.set(key, b"1", nx=True, px=ttl_ms)
            )
        except SharedUnavailable:
            return True
        return bool(claimed)
