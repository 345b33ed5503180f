"""The shared state's metrics (`kvfence_gateway_` prefix), registered with the app's `Metrics`:
the Redis operations that failed, and the decisions taken without Redis.

Invariant: labels are fixed operation and decision names.
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import Counter

from gateway.metrics import Metrics


class FleetMetrics:
    def __init__(self, metrics: Metrics) -> None:
        p, r = "kvfence_gateway_", metrics.registry
        self.shared_failures = Counter(
            p + "shared_state_failures",
            "Redis operations that failed (the policy's on_failure applied)",
            ["op"],
            registry=r,
        )
        self.shared_refused = Counter(
            p + "shared_state_refused",
            "Shared values not taken (missing, invalid: forged, moved or future-dated, older "
            "than one this worker saw): what this worker knows was written back instead",
            ["what", "why"],
            registry=r,
        )
        self.shared_fallbacks = Counter(
            p + "shared_state_fallbacks",
            "Decisions taken without the shared state, by what was decided and how",
            ["what", "action"],
            registry=r,
        )


FLEET_METRICS = web.AppKey("kvfence_fleet_metrics", FleetMetrics)
