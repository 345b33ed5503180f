"""Typed per-request slots shared along the filter chain and the response side; filters import
these, never each other. Each app-wide key lives beside the class it holds.

Invariant: each slot has one writer (named below), which runs before any reader; `ROUTE` and
`BODY` have one more, `gateway.routing.retarget`, which moves a request to another backend
(the replica step, a failover) before the steps that depend on the backend run again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.fleet.budgeter import Reservation

# Re-exported for `gateway.shared`, which takes these app keys from here.
from gateway.fleet.limiter import LIMITER as LIMITER
from gateway.fleet.limiter import Admission
from gateway.metrics import METRICS as METRICS
from gateway.policy.registry import KeyInfo
from gateway.policy.runtime import Route, Runtime
from gateway.policy.tenant_model import Tenant
from gateway.verify.service import VERIFY as VERIFY
from kvfence.public import PublicPart

# A step of the request chain: reads and writes these slots, may raise a GatewayError to answer.
Filter = Callable[[web.Request], Awaitable[None]]


@dataclass(slots=True)
class Timing:
    """Monotonic timestamps (seconds) for the latency metrics: `start` by the app, the upstream
    and client ones by the relay, `first_event` (a stream's first event from upstream) by the
    exchange."""

    start: float
    upstream_sent: float = 0.0
    upstream_headers: float = 0.0
    client_headers: float = 0.0
    first_event: float = 0.0


RUNTIME = web.RequestKey("kvfence_runtime", Runtime)  # app middleware
REQUEST_ID = web.RequestKey("kvfence_request_id", str)  # app middleware
TIMING = web.RequestKey("kvfence_timing", Timing)  # app middleware
TENANT = web.RequestKey("kvfence_tenant", Tenant)  # filters.authn
# The registry key that authenticated the request; unset for a key the policy file lists.
API_KEY = web.RequestKey("kvfence_api_key", KeyInfo)  # filters.authn
BODY: web.RequestKey[dict[str, Any]] = web.RequestKey(
    "kvfence_body", dict
)  # filters.body (and routing.retarget)
ROUTE = web.RequestKey("kvfence_route", Route)  # filters.route (and routing.retarget)
# A session-scoped tenant's session id from the body; set only when sent.
PROMPT_CACHE_KEY: web.RequestKey[object] = web.RequestKey(
    "kvfence_prompt_cache_key", object
)  # filters.scrub
NAMESPACE = web.RequestKey("kvfence_namespace", str)  # filters.namespace
# The leading parts of the prompt our backend may cache in public namespaces (may be empty).
PUBLIC: web.RequestKey[tuple[PublicPart, ...]] = web.RequestKey(
    "kvfence_public", tuple
)  # filters.public
UPSTREAM_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey(
    "kvfence_upstream_headers", dict
)  # filters.adapter
# The exact bytes sent upstream (a kvfence handle binds their digest).
UPSTREAM_BODY = web.RequestKey("kvfence_upstream_body", bytes)  # filters.adapter
# The client asked to see usage in its stream (the gateway asks for it upstream either way);
# True for every answer the gateway asks nothing extra for.
USAGE_ASKED = web.RequestKey("kvfence_usage_asked", bool)  # filters.adapter
ADMITTED = web.RequestKey("kvfence_admitted", bool)  # filters.limit: release at the end
ADMISSION = web.RequestKey("kvfence_admission", Admission)  # filters.limit: what to release
# The backends to try, best first (a model with several), and the body before the adapter step,
# from which a retry on another backend is scoped afresh.
CANDIDATES: web.RequestKey[tuple[Route, ...]] = web.RequestKey(
    "kvfence_candidates", tuple
)  # filters.replica
UNSCOPED_BODY = web.RequestKey("kvfence_unscoped_body", bytes)  # filters.replica
# Tokens held against the request's budgets: settled (released and charged) at its end.
RESERVATION = web.RequestKey("kvfence_reservation", Reservation)  # filters.budget
USED_TOKENS = web.RequestKey("kvfence_used_tokens", int)  # audit.settle: what the answer used
# The request body exactly as received (decoded), for its receipt's request.received digest.
RECEIVED_BODY = web.RequestKey("kvfence_received_body", bytes)  # filters.body
# The user or session id the namespace was derived with ("" for tenant scope).
SCOPE_VALUE = web.RequestKey("kvfence_scope_value", str)  # filters.namespace
# The receipt id of the answer's settled exchange (an error answer carries it too).
RECEIPT_ID = web.RequestKey("kvfence_receipt_id", str)  # receipts.service
STREAM_OPEN = web.RequestKey("kvfence_stream_open", bool)  # audit.settle: its first byte may go
