"""The watch: runs canary rounds when they are due (one worker at a time, chosen by a file
lock), and applies every change of a backend's health: rounds, violations found in answers,
an operator's release. Every quarantine transition is logged, counted and audit-logged.

Invariant: all changes go through `apply`, the one writer of the shared health board.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable

from aiohttp import web

from gateway.audit.chain.log import AuditWriteError
from gateway.audit.sink import AUDIT_SINK
from gateway.fleet.local_health import Health
from gateway.policy.backend_model import Backend
from gateway.relay.session import SESSION
from gateway.state import HOLDER, METRICS, VERIFY
from gateway.verify import quarantine
from gateway.verify.canary import Outcome, Result, run_round
from kvfence.namespace import NamespaceKey
from kvfence.probe.errors import ProbeError

log = logging.getLogger("kvfence.gateway.verify")
TICK_S = 1.0
_WORST = {Outcome.SHARED: 2, Outcome.INCONCLUSIVE: 1, Outcome.ISOLATED: 0}


class Watch:
    def __init__(self, app: web.Application) -> None:
        self.app = app

    def _backend(self, name: str) -> Backend | None:
        policy = self.app[HOLDER].runtime.policy
        return next((b for b in policy.backends if b.name == name), None)

    async def run(self) -> None:
        """Forever: each tick, run the rounds that are due, if this worker holds the lock."""
        lock = os.open(self.app[VERIFY].canary_lock, os.O_RDWR | os.O_CREAT, 0o600)
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
        return await self.app[VERIFY].health.claim_round(backend.name, interval)

    def _due(self) -> list[Backend]:
        health, now = self.app[VERIFY].health, time.time()
        out = []
        for backend in self.app[HOLDER].runtime.policy.backends:
            canary = backend.verify.canary if backend.verify else None
            if canary is not None and health.get(backend.name).canary_at + canary.interval_s <= now:
                out.append(backend)
        return out

    async def round(self, backend: Backend) -> list[Result]:
        """One round per model of `backend`; the worst outcome changes its health."""
        canary = backend.verify.canary if backend.verify else None
        if canary is None:
            return []
        runtime = self.app[HOLDER].runtime
        key = NamespaceKey(
            runtime.policy.gateway.active_key.id, runtime.policy.gateway.active_key.secret.value
        )
        timeout = runtime.policy.gateway.timeouts.first_byte_s
        results = []
        for model in backend.models:
            route = next(r for r in runtime.routes[model.name] if r.backend.name == backend.name)
            try:
                result = await run_round(
                    self.app[SESSION], route.adapter, backend, model, canary, key,
                    self.app[VERIFY].markers, timeout,
                )  # fmt: skip
            except ProbeError as exc:
                result = Result(backend.name, model.name, Outcome.INCONCLUSIVE, str(exc), "-", 0)
            results.append(result)
            metrics = self.app[METRICS]
            metrics.canary_rounds.labels(backend.name, result.outcome.value).inc()
            _log_round(result)
        worst = max(results, key=lambda r: _WORST[r.outcome])
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_round(h, worst, canary, now))
        return results

    async def violation(self, backend: Backend, kind: str) -> None:
        """A violation found in a tenant's answer (`marker` or `detective`)."""
        canary = backend.verify.canary if backend.verify else None
        self.app[METRICS].violations.labels(backend.name, kind).inc()
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_violation(h, kind, canary, now))

    async def release(self, name: str) -> Health:
        _, after = await self.apply(name, quarantine.release, by="operator")
        return after

    async def apply(
        self, name: str, change: Callable[[Health], Health], by: str = "gateway"
    ) -> tuple[Health, Health]:
        before, after = await self.app[VERIFY].health.update(name, change)
        if before.quarantined != after.quarantined:
            event = "quarantine" if after.quarantined else "release"
            reason = after.quarantine_reason if after.quarantined else f"released by {by}"
            self.app[METRICS].quarantine_transitions.labels(name, event).inc()
            log.warning(event, extra={"backend": name, "reason": reason})
            entry = {
                "event": event,
                "backend": name,
                "reason": reason,
                "time": round(time.time(), 3),
            }
            settings = self.app[HOLDER].runtime.policy.gateway.audit_log
            with contextlib.suppress(
                AuditWriteError
            ):  # the audit log's own failure is counted there
                await self.app[AUDIT_SINK].append(settings, entry)
        return before, after


def _log_round(result: Result) -> None:
    level = logging.INFO if result.outcome is Outcome.ISOLATED else logging.WARNING
    fields = {"backend": result.backend, "model": result.model, "outcome": result.outcome.value}
    log.log(level, "canary round", extra={**fields, "reason": result.reason, "by": result.by})
