"""Typed per-request slots shared along the filter chain; filters import these, never each other.

Invariant: each slot has exactly one writer (named below), which runs before any reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway.fleet.limiter import Admission, Limiter
from gateway.fleet.local_limits import SharedLimits
from gateway.listener.edge import Edge
from gateway.metrics import Metrics
from gateway.policy.reload import PolicyHolder
from gateway.policy.runtime import Route, Runtime
from gateway.policy.tenant_model import Tenant
from gateway.routing.replicas import Replicas
from gateway.verify.service import Verification
from kvfence.public import PublicPart


@dataclass(slots=True)
class InFlight:
    """Proxied requests this worker holds now (for `limits.max_in_flight`)."""

    count: int = 0


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
BODY: web.RequestKey[dict[str, Any]] = web.RequestKey("kvfence_body", dict)  # filters.body
ROUTE = web.RequestKey("kvfence_route", Route)  # filters.route
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
DROP_USAGE = web.RequestKey("kvfence_drop_usage", bool)  # filters.adapter
ADMITTED = web.RequestKey("kvfence_admitted", bool)  # filters.limit: release at the end
ADMISSION = web.RequestKey("kvfence_admission", Admission)  # filters.limit: what to release
# The backends to try, best first (a model with several), and the body before the adapter step,
# from which a retry on another backend is scoped afresh.
CANDIDATES: web.RequestKey[tuple[Route, ...]] = web.RequestKey(
    "kvfence_candidates", tuple
)  # filters.replica
UNSCOPED_BODY = web.RequestKey("kvfence_unscoped_body", bytes)  # filters.replica
USED_TOKENS = web.RequestKey("kvfence_used_tokens", int)  # audit.settle: what the answer used
METRICS = web.AppKey("kvfence_metrics", Metrics)
VERIFY = web.AppKey("kvfence_verify", Verification)
HOLDER = web.AppKey("kvfence_policy_holder", PolicyHolder)
LIMITS = web.AppKey("kvfence_limits", SharedLimits)
IN_FLIGHT = web.AppKey("kvfence_in_flight", InFlight)
EDGE = web.AppKey("kvfence_edge", Edge)  # counts and logs malformed requests
REPLICAS = web.AppKey("kvfence_replicas", Replicas)  # this worker's ejections
LIMITER = web.AppKey("kvfence_limiter", Limiter)  # tenant limits: local or in Redis
