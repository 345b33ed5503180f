"""Token budgets at admission: once the body is read and the model routed, the request's
reservation (its prompt's bytes plus its `max_tokens`, or `DEFAULT_MAX_TOKENS` without one) is
held against its tenant's and key's budgets; the app's middleware settles it when the request
ends (`gateway.fleet.budgeter`).

Invariant: a request with a budget is sent upstream only holding a reservation, which is
settled exactly once; a refused one costs the upstream nothing.
"""

from __future__ import annotations

import time
from typing import Any, Final

from aiohttp import web

from gateway.control.engine import ControlUnavailable as DatabaseDown
from gateway.errors import BudgetExceeded, ControlUnavailable
from gateway.fleet.budgeter import BUDGETS, Reservation
from gateway.metrics import METRICS
from gateway.state import API_KEY, BODY, RECEIVED_BODY, REQUEST_ID, RESERVATION, TENANT

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
    if not tenant.budgets.any and (key is None or not key.budgets.any):
        return
    tokens = reservation_tokens(request[BODY], request.get(RECEIVED_BODY, b""))
    try:
        outcome = await request.app[BUDGETS].reserve(tenant, key, request[REQUEST_ID], tokens)
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
