"""Per-tenant limits: token budgets per hour, day and month (the tenant's and its key's,
gateway.fleet.budgeter), then requests per second, requests in flight and tokens per minute,
shared by every worker (gateway.fleet.local_limits). Runs right after authentication, before the
body is read.

With `gateway.shared`, the limits hold across gateway replicas (gateway.fleet.limiter).

Invariant: a request admitted here is released exactly once, by the app's middleware, with the
tokens its answer reported; a refused one costs the upstream nothing.
"""

from __future__ import annotations

import time

from aiohttp import web

from gateway.errors import BudgetExceeded, RateLimited
from gateway.fleet.budgeter import BUDGETS
from gateway.fleet.limiter import LIMITER, Admission
from gateway.metrics import METRICS
from gateway.state import ADMISSION, ADMITTED, API_KEY, TENANT


async def admit(request: web.Request) -> None:
    tenant = request[TENANT]
    key = request.get(API_KEY)
    if tenant.budgets.any or (key is not None and key.budgets.any):  # before any allowance
        spent = await request.app[BUDGETS].check(tenant, key)
        if spent is not None:
            metrics = request.app[METRICS]
            metrics.child(metrics.budget_refusals, tenant.id, spent.of, spent.period).inc()
            raise BudgetExceeded(spent.message, spent.renews - time.time())
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
