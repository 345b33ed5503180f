"""The watch: runs canary rounds when they are due (on a jittered schedule, one worker at a
time, chosen by a file lock), runs the round a tenant's suspicious answer triggers (shaped like
that request, within the per-tenant and traffic-share limits), confirms a timing-only `shared`
with a second round, and applies every change of a backend's health: rounds, markers found in
answers, detective findings, an operator's release. Every quarantine transition is logged,
counted and audit-logged (through the record writer the app gives it).

Invariant: all changes go through `apply`, the one writer of the shared health board; nothing
but a `shared` round (confirmed when timing alone said so) or a live marker quarantines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import aiohttp
from aiohttp import web

from gateway.fleet.local_health import Health
from gateway.inputs.paths import CHAT, PROXIED_PATHS
from gateway.metrics import Metrics
from gateway.policy.backend_model import Backend, CanarySettings
from gateway.policy.reload import PolicyHolder
from gateway.verify import quarantine
from gateway.verify.budget import TriggerBudget
from gateway.verify.canary import Result, run_round
from gateway.verify.detective import ATTRIBUTED, Finding
from gateway.verify.reach import ReachWatch
from gateway.verify.service import Verification
from gateway.verify.shapes import Shape, Shapes
from gateway.verify.target import Target
from kvfence.namespace import NamespaceKey
from kvfence.probe.errors import ProbeError
from kvfence.probe.outcome import Outcome

log = logging.getLogger("kvfence.gateway.verify")
TICK_S: Final = 1.0
_WORST: Final = {Outcome.SHARED: 2, Outcome.INCONCLUSIVE: 1, Outcome.ISOLATED: 0}
CONFIRM_TRIES: Final = 2  # rounds that may confirm a timing-only shared (false: <= 2 alpha^2)

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
        self.shapes: dict[str, Shapes] = {}  # per backend: what its traffic sent lately
        self.budget = TriggerBudget()
        self.reach = ReachWatch(verification)
        self._triggered: set[str] = set()  # backends with a triggered round in flight here
        self._tasks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Forever: each tick, run the rounds that are due, if this worker holds the lock."""
        lock = os.open(self.verification.canary_lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                await asyncio.sleep(TICK_S)
                await self.reach.tick(self.holder.runtime.policy)
                if not self._due():
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
            for task in self._tasks:
                task.cancel()

    async def _claim(self, backend: Backend) -> bool:
        canary = backend.verify.canary if backend.verify else None
        interval = canary.interval_s if canary is not None else TICK_S
        return await self.verification.health.claim_round(backend.name, interval)

    def due_at(self, health: Health, canary: CanarySettings) -> float:
        """When the next scheduled round is due: `interval_s` times a factor in 1 +- jitter,
        drawn from the last round's id under the gateway's key (no tenant can predict it)."""
        mac = hmac.new(self.verification.secret, health.canary_id.encode(), hashlib.sha256)
        draw = int.from_bytes(mac.digest()[:8], "big") / 2**64
        return health.canary_at + canary.interval_s * (1 + canary.jitter * (2 * draw - 1))

    def _due(self) -> list[Backend]:
        health, now = self.verification.health, time.time()
        out = []
        for backend in self.holder.runtime.policy.backends:
            canary = backend.verify.canary if backend.verify else None
            if canary is not None and self.due_at(health.get(backend.name), canary) <= now:
                out.append(backend)
        return out

    def saw(self, backend: Backend, shape: Shape) -> None:
        """A tenant request's shape (the exchange samples them): scheduled rounds follow."""
        self.shapes.setdefault(backend.name, Shapes()).saw(shape)

    async def round(
        self, backend: Backend, trigger: str = "schedule", shape: Shape | None = None
    ) -> list[Result]:
        """One round per model of `backend`; the worst outcome changes its health."""
        canary = backend.verify.canary if backend.verify else None
        if canary is None:
            return []
        runtime = self.holder.runtime
        gateway = runtime.policy.gateway
        key = NamespaceKey(gateway.active_key.id, gateway.active_key.secret.value)
        results = []
        for model in backend.models:
            route = next(r for r in runtime.routes[model.name] if r.backend.name == backend.name)
            target = Target(
                self._session(),
                route.adapter,
                backend,
                model,
                key,
                self.verification.markers,
                gateway.timeouts.first_byte_s,
            )
            chosen = shape or self._shape(backend, canary, route.adapter.paths)
            result = await self._decided(target, canary, chosen, trigger)
            results.append(result)
            self._count(result)
        worst = max(results, key=lambda r: _WORST[r.outcome])
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_round(h, worst, canary, now))
        return results

    def _shape(self, backend: Backend, canary: CanarySettings, paths: frozenset[str]) -> Shape:
        served = sorted(paths & PROXIED_PATHS)
        if not self.verification.health.get(backend.name).rounds:  # the first: the plain one
            first = CHAT if CHAT in served else served[0]
            return Shape(first, True, 1, canary.prompt_tokens)
        return self.shapes.setdefault(backend.name, Shapes()).draw(served, canary.prompt_tokens)

    async def _decided(
        self, target: Target, canary: CanarySettings, shape: Shape, trigger: str
    ) -> Result:
        """A round; a timing-only `shared` stands only when a second round confirms it (an
        inconclusive second round gets one more try; an isolated one ends it)."""
        result = await self._one(target, canary, shape, trigger)
        if result.outcome is not Outcome.SHARED or result.by != "timing":
            return result
        requests = result.requests
        for _ in range(CONFIRM_TRIES):
            again = await self._one(target, canary, shape, "confirm")
            requests += again.requests
            if again.outcome is Outcome.SHARED:
                why = f"{result.reason}; confirmed by round {again.round_id} ({again.by})"
                return dataclasses.replace(result, reason=why, requests=requests)
            if again.outcome is Outcome.ISOLATED:
                break
        why = (
            f"a timing-only shared was not confirmed by a second round "
            f"({again.outcome.value}): {result.reason}"
        )
        return dataclasses.replace(
            result, outcome=Outcome.INCONCLUSIVE, reason=why, requests=requests
        )

    async def _one(
        self, target: Target, canary: CanarySettings, shape: Shape, trigger: str
    ) -> Result:
        target = dataclasses.replace(target, sent=[0])  # this round's sends only
        try:
            result = await run_round(target, canary, shape, trigger)
        except ProbeError as exc:
            result = Result(
                target.backend.name,
                target.model.name,
                Outcome.INCONCLUSIVE,
                str(exc),
                "-",
                target.sent[0],
                shape=shape.label,
                trigger=trigger,
                at=time.time(),
            )
        self.metrics.canary_requests.labels(target.backend.name, trigger).inc(result.requests)
        _log_round(result)
        return result

    def _count(self, result: Result) -> None:
        self.metrics.canary_rounds.labels(result.backend, result.outcome.value).inc()
        path, stream = result.shape.split("/")[:2] if result.shape else ("-", "-")
        self.metrics.canary_shapes.labels(result.backend, path, stream).inc()

    async def finding(self, backend: Backend, tenant: str, shape: Shape, finding: Finding) -> None:
        """An answer's hit that its own namespace does not explain: an attributed one is
        counted; either way a round shaped like the request runs, within the limits."""
        canary = backend.verify.canary if backend.verify else None
        if finding.reason == ATTRIBUTED:
            self.metrics.violations.labels(backend.name, "detective").inc()
            await self.apply(backend.name, quarantine.after_finding)
        if canary is None or self.verification.health.get(backend.name).quarantined:
            return
        allowed = backend.name not in self._triggered and self.budget.take(
            backend.name, tenant, canary, time.time()
        )
        self.metrics.canary_triggered.labels(
            backend.name, finding.reason, "run" if allowed else "limited"
        ).inc()
        if allowed:
            self._triggered.add(backend.name)
            task = asyncio.create_task(self._triggered_round(backend, shape))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def idle(self) -> None:
        """Wait for the triggered rounds in flight here (tests and shutdown)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _triggered_round(self, backend: Backend, shape: Shape) -> None:
        try:
            results = await self.round(backend, "tenant", shape)
            self.budget.spent(backend.name, sum(r.requests for r in results))
        except Exception:  # a background round must never die silently
            log.exception("triggered canary round failed", extra={"backend": backend.name})
        finally:
            self._triggered.discard(backend.name)

    async def marker(self, backend: Backend) -> None:
        """A live canary marker in a tenant's answer: the backend is quarantined."""
        canary = backend.verify.canary if backend.verify else None
        self.metrics.violations.labels(backend.name, "marker").inc()
        now = time.time()
        await self.apply(backend.name, lambda h: quarantine.after_marker(h, canary, now))

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
    extra = {
        "reason": result.reason,
        "by": result.by,
        "shape": result.shape,
        "trigger": result.trigger,
        "round": result.round_id,
        "requests": result.requests,
    }
    log.log(level, "canary round", extra={**fields, **extra})
