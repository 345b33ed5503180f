"""Moving a request to another backend of its model (the replica step's choice, a failover's
next try): the route changes, the body goes back to its form before the adapter step and is
pruned again for the new backend's kind and extra fields. The steps that depend on the backend
(public parts, the adapter) run again afterwards; the caller runs them.

Invariant: a request never reaches a backend with fields that backend's policy does not allow.
"""

from __future__ import annotations

from aiohttp import web

from gateway.inputs import jsonbody
from gateway.inputs.allowlist import enforce
from gateway.metrics import METRICS
from gateway.policy.runtime import Route
from gateway.state import BODY, ROUTE, RUNTIME, UNSCOPED_BODY


def retarget(request: web.Request, route: Route) -> None:
    previous = request[ROUTE]
    request[ROUTE] = route
    if UNSCOPED_BODY in request:
        request[BODY] = jsonbody.loads(request[UNSCOPED_BODY])
    backend = route.backend
    old = previous.backend
    if (backend.kind, backend.extra_fields) != (old.kind, old.extra_fields):
        body, metrics = request[BODY], request.app[METRICS]
        mode = request[RUNTIME].policy.gateway.field_modes
        enforce(request.path, body, backend.kind, backend.name, backend.extra_fields, mode, metrics)
