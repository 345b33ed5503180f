"""What a worker holds now, for its probes to tell "busy" from "broken": its connections (at
their cap, or newcomers waiting) and its proxied requests in flight (`limits.max_in_flight`).

Invariant: busy is never a failure: `/healthz` stays 200 and `/readyz` reports it beside its
verdict; only what cannot work (`gateway.routing.liveness`) makes a probe fail.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.listener.connections import PRESSURE


@dataclass(slots=True)
class InFlight:
    """Proxied requests this worker holds now (for `limits.max_in_flight`)."""

    count: int = 0
    cap: int = 0  # the cap the last request was held to


IN_FLIGHT = web.AppKey("kvfence_in_flight", InFlight)


def busy(app: web.Application) -> list[str]:
    """Which of the worker's caps are reached: `connections`, `in_flight` (empty: none)."""
    out = []
    pressure = app.get(PRESSURE)
    if pressure is not None and pressure.busy:
        out.append("connections")
    held = app.get(IN_FLIGHT)
    if held is not None and held.cap and held.count >= held.cap:
        out.append("in_flight")
    return out
