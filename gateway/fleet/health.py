"""Per-backend verification state (quarantine, canary outcomes, violations) shared by the gateway
replicas in Redis: one hash, a field per backend (an HMAC of its name), each value sealed
(`sealed`) with the backend's name bound into its tag; re-read by every worker of every replica
every `REFRESH_S`, so replicas agree on a change within that (plus a round trip).

Invariant: what a worker holds for a backend changes only to an authentic value newer than the
one it holds (its file board, which every worker of this gateway shares, keeps it across a
restart of the worker). A missing, forged, moved, future-dated or replayed value changes
nothing: the worker writes back what it holds, so a quarantine survives Redis losing its data
and is lifted only by a gateway's release or clean rounds; a backend no worker knows of stays
unknown (never verified); a board or claim of another Redis type reads as values that are not
authentic. A change is a read-modify-write in one optimistic transaction; one Redis could not
take is honoured by this worker at once and written when Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path

import orjson
from redis.exceptions import ResponseError, WatchError

from gateway.fleet.local_health import (
    NEVER_CHECKED,
    REFRESH_S,
    Health,
    HealthBoard,
    newest,
    stamped,
)
from gateway.fleet.store import SharedStore, as_bytes, typed, wrong_type
from gateway.fleet.unavailable import SharedUnavailable

log = logging.getLogger("kvfence.gateway.shared")
Change = Callable[[Health], Health]
_HEALTH = "health"  # the sealer's name for a backend's value
_CLAIM = "canary-claim"


class SharedHealthBoard(HealthBoard):
    """A `HealthBoard` shared with the other replicas through Redis; the file underneath is this
    gateway's own memory of the newest state it saw per backend."""

    def __init__(self, path: Path, store: SharedStore, backends: Callable[[], Iterable[str]]):
        super().__init__(path)
        self.store = store
        self.backends = backends
        self._key = store.key("health")
        self._pending: list[tuple[str, Change]] = []  # changes Redis has not taken yet
        self._overlay: dict[str, Health] = {}  # what this worker holds with them applied
        self._claimer = os.urandom(8).hex().encode()

    def get(self, backend: str) -> Health:
        held = self._overlay.get(backend) or self.view.get(backend) or NEVER_CHECKED
        return self.floored(backend, held)

    def _field(self, name: str) -> str:
        return self.store.key("backend", name)

    def _open(self, name: str, raw: bytes | None) -> Health | None:
        opened = self.store.sealer.open(_HEALTH, name, raw)
        if opened is None:
            return None
        try:
            health = Health.from_json(orjson.loads(opened.value))
        except orjson.JSONDecodeError:
            return None  # sealed by a gateway, so never: but unknown, not a default
        return dataclasses.replace(health, updated_at=opened.written)

    def _seal(self, name: str, health: Health) -> bytes:
        data = {k: v for k, v in health.as_json().items() if k != "updated_at"}
        return self.store.sealer.seal(_HEALTH, name, orjson.dumps(data), now=health.updated_at)

    async def refresh(self) -> None:
        """Apply the changes Redis missed while down, then take every newer authentic value and
        write back what this worker holds where Redis has nothing, a value that is not
        authentic, or an older one."""
        while self._pending:
            name, change = self._pending[0]
            await self.store.call("health_write", self._apply(name, change))
            self._pending.pop(0)
        self._overlay.clear()
        names = sorted(set(self.backends()))
        if not names:
            return
        fields = [self._field(n) for n in names]
        # A board of another Redis type holds no value of ours: each reads as not authentic.
        raw = await self.store.call(
            "health_read", typed(self.store.client.hmget(self._key, fields), [b""] * len(names))
        )
        await asyncio.to_thread(self._load)  # what another worker of this gateway took
        taken, stale = {}, []
        for name, value in zip(names, raw, strict=True):
            found, held = self._open(name, as_bytes(value)), self.view.get(name)
            if found is not None and (held is None or found.updated_at > held.updated_at):
                taken[name] = found
            elif held is not None and (found is None or found.updated_at < held.updated_at):
                why = "missing" if value is None else "invalid" if found is None else "older"
                self.store.metrics.shared_refused.labels("health", why).inc()
                stale.append((name, why))
        if taken:
            await asyncio.to_thread(self._keep_locked, taken)
        for name, why in stale:
            log.warning("shared health value refused: wrote back what this gateway holds",
                        extra={"why": why, "backend": name})  # fmt: skip
            await self.store.call("health_write", self._apply(name, lambda h: h, stamp=False))

    def _keep_locked(self, found: Mapping[str, Health]) -> None:
        for name, health in found.items():
            self._update_locked(name, partial(_newer, health), stamp=False)

    async def watch(self) -> None:
        task = asyncio.current_task()
        while True:
            # A failure is counted and logged by the store; what this worker holds stands.
            with contextlib.suppress(SharedUnavailable):
                await self.refresh()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError  # a cancel the client absorbed: stop all the same
            await asyncio.sleep(REFRESH_S)

    async def _apply(self, name: str, change: Change, stamp: bool = True) -> tuple[Health, Health]:
        """Change the newest of what Redis and this worker hold, in one transaction; the result
        is written to Redis and kept here."""
        field = self._field(name)
        async with self.store.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(self._key)
                    raw = await typed(pipe.hget(self._key, field), b"")
                    found = self._open(name, as_bytes(raw))
                    held = newest(self.view.get(name) or NEVER_CHECKED, found)
                    before = self.floored(name, held)
                    after = change(before)
                    after = stamped(before, after) if stamp else after
                    pipe.multi()  # type: ignore[no-untyped-call]
                    pipe.hset(self._key, field, self._seal(name, after))
                    await pipe.execute()
                    break
                except WatchError:
                    continue  # another replica changed the board: read it again
                except ResponseError as exc:
                    if not wrong_type(exc):
                        raise
                    # Not a hash: it holds no backend's state. Replaced; every worker writes
                    # back what it holds on its next refresh.
                    await self.store.client.delete(self._key)
        await asyncio.to_thread(self._keep_locked, {name: after})
        return before, after

    async def update(self, backend: str, change: Change) -> tuple[Health, Health]:
        try:
            return await self.store.call("health_write", self._apply(backend, change))
        except SharedUnavailable:
            before = self.get(backend)
            after = self._overlay[backend] = stamped(before, change(before))
            self._pending.append((backend, change))
            log.warning("health change kept locally until the shared state is back",
                        extra={"backend": backend})  # fmt: skip
            return before, after

    async def claim_round(self, backend: str, interval_s: float) -> bool:
        """One replica runs each due round: the first to set the round's claim (sealed; it
        expires after most of an interval, so a replica that died mid-round does not stop the
        next one). A claim that is not authentic or too old is taken over: it cannot stop a
        round. Redis unreachable: run it here (a round too many is safe, a round too few is
        not)."""
        key = self.store.key("canary", backend)
        ttl_s = max(1.0, interval_s * 0.9)
        value = self.store.sealer.seal(_CLAIM, backend, self._claimer)
        client = self.store.client
        try:
            ttl_ms = int(ttl_s * 1000)
            if await self.store.call("canary_claim", client.set(key, value, nx=True, px=ttl_ms)):
                return True
            held = await self.store.call("canary_claim", typed(client.get(key), b""))
            if self.store.sealer.open(_CLAIM, backend, as_bytes(held), max_age_s=ttl_s):
                return False
            self.store.metrics.shared_refused.labels("canary_claim", "invalid").inc()
            await self.store.call("canary_claim", client.set(key, value, px=ttl_ms))
        except SharedUnavailable:
            pass
        return True


def _newer(found: Health, held: Health) -> Health:
    return newest(held, found)
