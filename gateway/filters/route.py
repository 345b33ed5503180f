"""Policy check: the tenant may use the requested model; the first of its backends that is not
quarantined, and serves this path, takes the request (none serves it: 404 naming the paths they
do serve, never a 5xx).

Invariant: a quarantined backend receives no tenant traffic, and a failover stays among the
model's backends (which the policy keeps all scoped or all unscoped).
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import BackendQuarantined, BadRequest, ModelNotFound, PathNotServed
from gateway.state import BODY, ROUTE, RUNTIME, TENANT
from gateway.verify.service import VERIFY


async def choose_route(request: web.Request) -> None:
    model = request[BODY].get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("the request needs a model", param="model")
    runtime = request[RUNTIME]
    routes = runtime.routes.get(model)
    # Unknown and forbidden models answer alike, so a tenant learns nothing about others' models.
    if routes is None or model not in runtime.allowed[request[TENANT].id]:
        raise ModelNotFound(model)
    serving = [r for r in routes if request.path in r.adapter.paths]
    if not serving:
        paths = ", ".join(sorted({p for r in routes for p in r.adapter.paths}))
        raise PathNotServed(
            f"{request.path} is not served for model {model}: its backends serve {paths}"
        )
    health = request.app[VERIFY].health
    for route in serving:
        if not health.get(route.backend.name).quarantined:
            request[ROUTE] = route
            return
    raise BackendQuarantined(
        f"every backend serving model {model!r} is quarantined after a failed isolation check"
    )
