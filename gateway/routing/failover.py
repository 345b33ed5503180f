"""The terminal step for a model with several backends: forward to the best one; if it cannot
be reached, or gives no answer, before the first byte reached the client, forward once more to
the next (at most `routing.retries` more). Every outcome feeds this worker's passive ejection.

Invariant: a retry happens only while no upstream answer has begun (so nothing reached the
client), and never to a backend quarantined by then; each attempt is settled (audited) once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from aiohttp import web

from gateway.errors import (
    BackendQuarantined,
    GatewayError,
    HandleRefused,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from gateway.metrics import METRICS
from gateway.relay.plain import forward
from gateway.routing.replicas import REPLICAS
from gateway.routing.retarget import retarget
from gateway.state import CANDIDATES, REQUEST_ID, ROUTE, RUNTIME, TIMING, Filter
from gateway.verify.service import VERIFY

log = logging.getLogger("kvfence.gateway.routing")
_RETRYABLE = (UpstreamUnavailable, UpstreamTimeout)
_BACKEND_FAULTS = (UpstreamUnavailable, UpstreamTimeout, HandleRefused)


async def failover(request: web.Request, rescope: Sequence[Filter]) -> web.StreamResponse:
    """`rescope`: the chain's steps that depend on the backend, run again for a retry."""
    tries = request.get(CANDIDATES) or (request[ROUTE],)
    replicas, settings = request.app[REPLICAS], request[RUNTIME].policy.gateway.routing
    health, metrics = request.app[VERIFY].health, request.app[METRICS]
    error: GatewayError | None = None
    for attempt, route in enumerate(tries):
        if attempt:
            if health.get(route.backend.name).quarantined:
                continue  # quarantined while the first attempt ran
            retarget(request, route)
            for step in rescope:  # what may be public, and how it is scoped, depend on it
                await step(request)
        name = route.backend.name
        try:
            response = await forward(request)
        except GatewayError as exc:
            error = exc
            if isinstance(exc, _BACKEND_FAULTS) and replicas.failed(name, settings):
                metrics.ejections.labels(name).inc()
            began = bool(request[TIMING].upstream_headers)
            if not isinstance(exc, _RETRYABLE) or began or attempt == len(tries) - 1:
                raise
            metrics.retries.labels(name).inc()
            fields = {"rid": request[REQUEST_ID], "backend": name, "error": exc.code}
            log.warning("retrying on another backend", extra=fields)
            continue
        if response.status < 500:
            replicas.succeeded(name)
        elif replicas.failed(name, settings):
            metrics.ejections.labels(name).inc()
        return response
    raise error or BackendQuarantined("every other backend of this model is quarantined")
