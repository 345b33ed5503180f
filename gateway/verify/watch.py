"""The watch: runs canary rounds when they are due (one worker at a time, chosen by a file
lock), and applies every change of a backend's health: rounds, violations found in answers,
an operator's release. Every quarantine transition is logged, counted and audit-logged
(through the record writer the app gives it).

Invariant: all changes go through `apply`, the one writer of the shared health board.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from gateway.fleet.local_health import Health
from gateway.metrics import Metrics
from gateway.policy.backend_model import Backend
from gateway.policy.reload import PolicyHolder
from gateway.verify import quarantine
from gateway.verify.canary import Result, run_round
from gateway.verify.service import Verification
from kvfence.namespace import NamespaceKey
from kvfence.probe.errors import ProbeError
from kvfence.probe.outcome import Outcome

log = logging.getLogger("kvfence.gateway.verify")
TICK_S = 1.0
_WORST = {Outcome.SHARED: 2, Outcome.INCONCLUSIVE: 1, Outcome.ISOLATED: 0}


Record = Callable[[dict[str, Any]], Awaitable[None]]


class Watch:
    """One per worker. `session` gives the app's upstream session (open once the app runs);
    `record` writes an audit record and never raises."""

    def __init__(
        self,
        holder: PolicyHolder,
        verification: Verification,
        metrics: Metrics,
        session: Callable[[], aiohttp.ClientSession],
        record: Record,
    ) -> None:
        self.holder, self.verification, self.metrics = holder, verification, metrics
        self._session, self._record = session, record

    async def run(self) -> None:
        """Forever: each tick, run the rounds that are due, if this worker holds the lock."""
        lock = os.open(self.verification.canary_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                await asyncio.sleep(TICK_S)
                due = self._due()
                if not due:
                    continue
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # another worker is running rounds
                try:
                    for backend in self._due():  # re-read: another worker may have run them
                        if await self._claim(backend):
                            await self.round(backend)
                finally:
                    fcntl.flock(lock, fcntl.LOCK_UN)
        finally:
            os.close(lock)

    async def _claim(self, backend: Backend) -> bool:
        canary = backend.verify.canary if backend.verify else None
        interval = canary.interval_s if canary is not None else TICK_S
        return await self.verification.health.claim_round(backend.name, interval)

    def _due(self) -> list[Backend]:
        health, now = self.verification.health, time.time()
        out = []
        for backend in self.holder.runtime.policy.backends:
            canary = backend.verify.canary if backend.verify else None
            if canary is not None and health.get(backend.name).canary_at + canary.interval_s <= now:
                out.append(backend)
        return out

    async def round(self, backend: Backend) -> list[Result]:
        """One round per model of `backend`; the worst outcome changes its health."""
        canary = backend.verify.canary if backend.verify else None
        if canary is None:
            return []
        runtime = self.holder.runtime
        key = NamespaceKey(
            runtime.policy.gateway.active_key.id, runtime.policy.gateway.active_key.secret.value
        )
        timeout = runtime.policy.gateway.timeouts.first_byte_s
        results = []
        for model in backend.models:
            route = next(r for r in runtime.routes[model.name] if r.backend.name == backend.name)
            try:
                result = await run_round(
                    self._session(), route.adapter, backend, model, canary, key,
                    self.verification.markers, timeout,
                )  # fmt: skip
            except ProbeError as exc:
                result = Result(backend.name, model.name, Outcome.INCONCLUSIVE, str(exc), "-", 0)
            results.append(result)
            self.metrics.canary_rounds.labels(backend.name, result.outcome.value).inc()
            _log_round(result)
        worst = max(results, key=lambda r: _WORST[r.outcome])
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_round(h, worst, canary, now))
        return results

    async def violation(self, backend: Backend, kind: str) -> None:
        """A violation found in a tenant's answer (`marker` or `detective`)."""
        canary = backend.verify.canary if backend.verify else None
        self.metrics.violations.labels(backend.name, kind).inc()
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_violation(h, kind, canary, now))

    async def release(self, name: str) -> Health:
        _, after = await self.apply(name, quarantine.release, by="operator")
        return after

    async def apply(
        self, name: str, change: Callable[[Health], Health], by: str = "gateway"
    ) -> tuple[Health, Health]:
        before, after = await self.verification.health.update(name, change)
        if before.quarantined != after.quarantined:
            event = "quarantine" if after.quarantined else "release"
            reason = after.quarantine_reason if after.quarantined else f"released by {by}"
            self.metrics.quarantine_transitions.labels(name, event).inc()
            log.warning(event, extra={"backend": name, "reason": reason})
            entry = {
                "event": event,
                "backend": name,
                "reason": reason,
                "time": round(time.time(), 3),
            }
            await self._record(entry)
        return before, after


WATCH = web.AppKey("kvfence_watch", Watch)


def _log_round(result: Result) -> None:
    level = logging.INFO if result.outcome is Outcome.ISOLATED else logging.WARNING
    fields = {"backend": result.backend, "model": result.model, "outcome": result.outcome.value}
    log.log(level, "canary round", extra={**fields, "reason": result.reason, "by": result.by})
