"""Tokens held at admission: once the body is read and the model routed, the request's
reservation (its prompt's bytes plus its `max_tokens`, or `DEFAULT_MAX_TOKENS` without one) is
held against its tenant's tokens per minute (`gateway.fleet.limiter`) and its tenant's and key's
budgets (`gateway.fleet.budgeter`); both are settled on what the answer used when it ends.

Invariant: a request with a budget or a tokens-per-minute limit is sent upstream only holding
its reservation, settled exactly once; a refused one costs the upstream nothing.
"""

from __future__ import annotations

import time
from typing import Any, Final

from aiohttp import web

from gateway import entropy
from gateway.control.engine import ControlUnavailable as DatabaseDown
from gateway.errors import BudgetExceeded, ControlUnavailable, RateLimited
from gateway.fleet.budgeter import BUDGETS, Reservation
from gateway.fleet.limiter import LIMITER
from gateway.metrics import METRICS
from gateway.state import ADMISSION, API_KEY, BODY, RECEIVED_BODY, REQUEST_ID, RESERVATION, TENANT

# The gateway does not know a model's context length: a request that names no limit reserves
# this many completion tokens (an answer longer than that is charged in full when it settles).
DEFAULT_MAX_TOKENS: Final = 4096
_LIMIT_FIELDS: Final = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def reservation_tokens(body: dict[str, Any], received: bytes) -> int:
    """An upper bound of what the request can use: every token of a prompt covers at least one
    byte of the body, and the completion is capped by its limit field."""
    limit = next((body[f] for f in _LIMIT_FIELDS if isinstance(body.get(f), int)), None)
    completion = limit if isinstance(limit, int) and limit > 0 else DEFAULT_MAX_TOKENS
    n = body.get("n")
    choices = n if isinstance(n, int) and n > 1 else 1
    return len(received) + completion * choices


async def reserve(request: web.Request) -> None:
    tenant, key = request[TENANT], request.get(API_KEY)
    budgets = tenant.budgets.any or (key is not None and key.budgets.any)
    admission = request.get(ADMISSION)
    per_minute = bool(tenant.limits.tokens_per_min) and admission is not None
    if not budgets and not per_minute:
        return
    tokens = reservation_tokens(request[BODY], request.get(RECEIVED_BODY, b""))
    if per_minute and admission is not None:
        refusal = await request.app[LIMITER].hold(tenant, admission, tokens)
        if refusal is not None:
            metrics = request.app[METRICS]
            metrics.child(metrics.limited, tenant.id, refusal.reason).inc()
            raise RateLimited(
                "this tenant's tokens per minute limit is reached; retry later",
                refusal.retry_after_s,
            )
    if not budgets:
        return
    try:
        rid = f"{request[REQUEST_ID]}.{entropy.token_hex(6)}"  # a client may repeat its ids
        outcome = await request.app[BUDGETS].reserve(tenant, key, rid, tokens)
    except DatabaseDown:
        metrics = request.app[METRICS]
        metrics.control_failures.labels("budget").inc()
        raise ControlUnavailable(
            "the gateway cannot reach its control database to check this budget; retry shortly",
            1.0,
        ) from None
    if isinstance(outcome, Reservation):
        request[RESERVATION] = outcome
    elif outcome is not None:
        metrics = request.app[METRICS]
        metrics.child(metrics.budget_refusals, tenant.id, outcome.of, outcome.period).inc()
        raise BudgetExceeded(outcome.message, outcome.renews - time.time())
