"""What one answered request leaves behind: its counts, latencies and time to first token in the
metrics (per tenant and model), its access log line, and for a failed upstream call the one
log line that says which URL failed and how.

Invariant: runs once per request, after its answer (or its failure) is decided; label values
come from the policy (tenant, model, backend) or are "-".
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from gateway.errors import GatewayError
from gateway.metrics import METRICS
from gateway.state import REQUEST_ID, ROUTE, RUNTIME, TENANT, Timing

access_log = logging.getLogger("kvfence.gateway.access")
log = logging.getLogger("kvfence.gateway")


UNCOUNTED = frozenset({"/healthz", "/readyz"})  # probes: they would swamp the request rate


def finish(request: web.Request, status: int, timing: Timing) -> None:
    if request.path in UNCOUNTED:
        return
    end = time.perf_counter()
    tenant = request[TENANT].id if TENANT in request else "-"
    route = request.get(ROUTE)
    backend = route.backend.name if route is not None else "-"
    model = route.model.name if route is not None else "-"
    m = request.app[METRICS]
    m.child(m.requests, tenant, model, backend, str(status)).inc()
    if timing.upstream_sent:
        m.child(m.latency, backend).observe(end - timing.start)
        after = timing.client_headers - timing.upstream_headers if timing.client_headers else 0.0
        m.added.observe(timing.upstream_sent - timing.start + after)
    if timing.first_event:
        m.child(m.first_token, tenant, model).observe(timing.first_event - timing.upstream_sent)
    if request[RUNTIME].policy.gateway.access_log:
        access_log.info(
            "request",
            extra={
                "rid": request[REQUEST_ID],
                "method": request.method,
                "path": request.path,
                "status": status,
                "tenant": tenant,
                "model": model,
                "backend": backend,
                "ms": round((end - timing.start) * 1000, 3),
            },
        )


def failed(request: web.Request, error: GatewayError) -> None:
    """An upstream failure (5xx with a cause): which backend and URL, and what went wrong."""
    if error.cause is None:
        return
    route = request.get(ROUTE)
    log.warning(
        "upstream failed",
        extra={
            "rid": request[REQUEST_ID],
            "status": error.status,
            "error": error.code,
            "backend": route.backend.name if route is not None else "-",
            "url": route.backend.url + request.path if route is not None else "-",
            "cause": error.cause,
        },
    )
