"""Policy check: the tenant may use the requested model, and its backend serves this path."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import BadRequest, Forbidden, NotSupported
from gateway.state import BODY, ROUTE, RUNTIME, TENANT


async def choose_route(request: web.Request) -> None:
    model = request[BODY].get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("the request needs a model")
    runtime = request[RUNTIME]
    route = runtime.routes.get(model)
    # Unknown and forbidden models answer alike, so a tenant learns nothing about others' models.
    if route is None or model not in runtime.allowed[request[TENANT].id]:
        raise Forbidden(f"model {model!r} is not available to this tenant")
    if request.path not in route.adapter.paths:
        raise NotSupported(f"{request.path} is not available for model {model!r}")
    request[ROUTE] = route
