"""This worker's passive view of each backend (consecutive errors, ejection) and the order in
which a model's backends are tried for one request.

Invariant: a quarantined backend is never in the order; a backend that the health checks found
down, or that this worker ejected, comes only after every usable one (a last resort, so a stale
check never turns a working fleet into a 503).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.policy.model import RoutingSettings, RoutingStrategy
from gateway.policy.runtime import Route
from gateway.routing.rendezvous import rank

log = logging.getLogger("kvfence.gateway.routing")


@dataclass(slots=True)
class Passive:
    errors: int = 0  # consecutive failed requests
    ejected_until: float = 0.0  # monotonic time; 0: not ejected
    ejections: int = 0

    def as_json(self, now: float) -> dict[str, Any]:
        left = max(0.0, self.ejected_until - now)
        return {
            "consecutive_errors": self.errors,
            "ejected_for_s": round(left, 1),
            "ejections": self.ejections,
        }


class Replicas:
    """Per worker (ejection is local, as a load balancer's outlier detection is)."""

    def __init__(self) -> None:
        self._passive: dict[str, Passive] = {}
        self._turns: dict[str, itertools.count[int]] = {}

    def passive(self, name: str) -> Passive:
        return self._passive.setdefault(name, Passive())

    def ejected(self, name: str, now: float | None = None) -> bool:
        found = self._passive.get(name)
        now = time.monotonic() if now is None else now
        return found is not None and found.ejected_until > now

    def failed(self, name: str, settings: RoutingSettings, now: float | None = None) -> bool:
        """Count a failure; True when it ejects the backend now."""
        state, now = self.passive(name), time.monotonic() if now is None else now
        state.errors += 1
        if state.errors < settings.eject_after_errors or state.ejected_until > now:
            return False
        state.ejected_until, state.errors = now + settings.eject_for_s, 0
        state.ejections += 1
        log.warning("backend ejected", extra={"backend": name, "for_s": settings.eject_for_s})
        return True

    def succeeded(self, name: str) -> None:
        state = self._passive.get(name)
        if state is not None:
            state.errors = 0

    def order(
        self,
        routes: Sequence[Route],
        namespace: str,
        settings: RoutingSettings,
        quarantined: Callable[[str], bool],
        down: Callable[[str], bool],
    ) -> list[Route]:
        """The routes to try, best first, for `namespace`; quarantined ones are left out."""
        allowed = [r for r in routes if not quarantined(r.backend.name)]
        now = time.monotonic()
        usable: list[Route] = []
        rest: list[Route] = []
        for route in allowed:
            name = route.backend.name
            (rest if down(name) or self.ejected(name, now) else usable).append(route)
        return self._arrange(usable, namespace, settings) + self._arrange(rest, namespace, settings)

    def _arrange(
        self, routes: list[Route], namespace: str, settings: RoutingSettings
    ) -> list[Route]:
        if len(routes) < 2:
            return routes
        if settings.strategy is RoutingStrategy.AFFINITY:
            by_name = {r.backend.name: r for r in routes}
            return [by_name[b.name] for b in rank(namespace, [r.backend for r in routes])]
        turn = self._turns.setdefault(routes[0].model.name, itertools.count())
        start = next(turn) % len(routes)
        return routes[start:] + routes[:start]


REPLICAS = web.AppKey("kvfence_replicas", Replicas)  # this worker's ejections
