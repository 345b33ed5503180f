"""Per-tenant limits: requests per second, requests in flight and tokens per minute, shared by
every worker (gateway.fleet.local_limits). Runs right after authentication, before the body is
read; token budgets are held once the body is (gateway.filters.budget).

With `gateway.shared`, the limits hold across gateway replicas (gateway.fleet.limiter).

Invariant: a request admitted here is released exactly once, by the app's middleware, with the
tokens its answer reported; a refused one costs the upstream nothing.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import RateLimited
from gateway.fleet.limiter import LIMITER, Admission
from gateway.metrics import METRICS
from gateway.state import ADMISSION, ADMITTED, TENANT


async def admit(request: web.Request) -> None:
    tenant = request[TENANT]
    outcome = await request.app[LIMITER].admit(tenant)
    if outcome is None:
        return
    if not isinstance(outcome, Admission):
        refusal = outcome
        metrics = request.app[METRICS]
        metrics.child(metrics.limited, tenant.id, refusal.reason).inc()
        raise RateLimited(
            f"this tenant's {refusal.reason.replace('_', ' ')} limit is reached; retry later",
            refusal.retry_after_s,
        )
    request[ADMITTED] = True
    request[ADMISSION] = outcome
