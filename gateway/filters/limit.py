"""Per-tenant limits: requests per second, requests in flight and tokens per minute, shared by
every worker (gateway.limits). Runs right after authentication, before the body is read.

Invariant: a request admitted here is released exactly once, by the app's middleware, with the
tokens its answer reported; a refused one costs the upstream nothing.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import RateLimited
from gateway.state import ADMITTED, LIMITS, METRICS, TENANT


async def admit(request: web.Request) -> None:
    tenant = request[TENANT]
    if not tenant.limits.any:
        return
    refusal = request.app[LIMITS].admit(tenant.id, tenant.limits)
    if refusal is not None:
        metrics = request.app[METRICS]
        metrics.child(metrics.limited, tenant.id, refusal.reason).inc()
        raise RateLimited(
            f"this tenant's {refusal.reason.replace('_', ' ')} limit is reached; retry later",
            refusal.retry_after_s,
        )
    request[ADMITTED] = True
