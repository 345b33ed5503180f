"""The fleet's metrics (`kvfence_gateway_` prefix), registered with the app's `Metrics`: retries
and ejections per backend, and the shared state's reachability and failures.

Invariant: labels are backend names from the policy or fixed operation names.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import Counter

from gateway.metrics import Metrics


class FleetMetrics:
    def __init__(self, metrics: Metrics) -> None:
        p, r = "kvfence_gateway_", metrics.registry
        self.retries = Counter(
            p + "retries",
            "Requests retried on another backend after this one failed before answering",
            ["backend"],
            registry=r,
        )
        self.ejections = Counter(
            p + "ejections",
            "Backends ejected by this worker after consecutive errors",
            ["backend"],
            registry=r,
        )
        self.shared_failures = Counter(
            p + "shared_state_failures",
            "Redis operations that failed (the policy's on_failure applied)",
            ["op"],
            registry=r,
        )
        self.shared_fallbacks = Counter(
            p + "shared_state_fallbacks",
            "Decisions taken without the shared state, by what was decided and how",
            ["what", "action"],
            registry=r,
        )


FLEET_METRICS = web.AppKey("kvfence_fleet_metrics", FleetMetrics)
