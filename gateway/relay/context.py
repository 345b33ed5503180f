"""An exchange's context built from its request (`gateway.audit.context`): the request's slots
read once, before the request is forwarded, and its books (`gateway.audit.settle.Books`).

Invariant: the one place the response side reads a request's slots; what it reads is what the
filter chain left for this attempt (a failover builds a new context for its retry).
"""

from __future__ import annotations

import time
from typing import Final

from aiohttp import web

from gateway.audit.context import AnswerContext
from gateway.audit.judge import AuditContext
from gateway.audit.settle import Books
from gateway.receipts import draft as receipts
from gateway.state import (
    BODY,
    NAMESPACE,
    PUBLIC,
    REQUEST_ID,
    ROUTE,
    RUNTIME,
    TENANT,
    TIMING,
    UPSTREAM_BODY,
    UPSTREAM_HEADERS,
    USAGE_ASKED,
)
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH

_NONE: Final[frozenset[str]] = frozenset()  # no public part: nearly every request


def context_of(request: web.Request) -> AnswerContext:
    """What this attempt's exchange is built from."""
    verification = request.app[VERIFY]
    route, parts = request[ROUTE], request.get(PUBLIC, ())
    audit = AuditContext(
        request_id=request[REQUEST_ID],
        tenant=request[TENANT].id,
        model=route.model.name,
        backend=route.backend,
        upstream_id=request[UPSTREAM_HEADERS]["x-request-id"],
        namespace=request[NAMESPACE],
        verifier=request[RUNTIME].attestations.get(route.backend.name),
        health=verification.health.get(route.backend.name),
        now=time.time(),
        public=frozenset(part.namespace for part in parts) if parts else _NONE,
    )
    receipt = receipts.start(request)
    return AnswerContext(
        audit=audit,
        path=request.path,
        body=request[BODY],
        sent_bytes=len(request[UPSTREAM_BODY]),
        usage_asked=request.get(USAGE_ASKED, True),
        markers=verification.markers,
        detective=verification.detective,
        watch=request.app[WATCH],
        timing=request[TIMING],
        receipt=receipt,
        ledger=Books(request, audit, receipt),
    )
