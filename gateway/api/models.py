"""`GET /v1/models` and `GET /v1/models/{model}`: the models the authenticated tenant may use
and some backend serves now, each with the card its backend gives (gateway.api.upstream_models),
or a card of the gateway's own when none does.

Invariant: a tenant sees only its own models; retrieving any other model, unknown or served to
others, answers the same 404 `model_not_found` the proxied paths answer. A model whose every
backend is down by the gateway's health checks (gateway.routing.liveness) is neither listed nor
retrieved, so a client never picks a model that can only answer 502; before the first checks
end nothing is known down, and every model is offered.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.api.upstream_models import cards
from gateway.errors import ModelNotFound
from gateway.filters.authn import authenticate
from gateway.relay.session import SESSION
from gateway.routing.liveness import LIVENESS
from gateway.state import RUNTIME, TENANT


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvfence"}


def _json(data: object) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


def _offered(request: web.Request) -> set[str]:
    """The tenant's models that some backend serves, by this worker's latest checks."""
    runtime, liveness = request[RUNTIME], request.app[LIVENESS]
    return {
        name
        for name in runtime.allowed[request[TENANT].id]
        if any(liveness.get(r.backend.name).up is not False for r in runtime.routes[name])
    }


async def _cards(request: web.Request, names: list[str]) -> list[dict[str, object]]:
    runtime, liveness = request[RUNTIME], request.app[LIVENESS]
    wanted = {
        n: [r.backend for r in runtime.routes[n] if liveness.get(r.backend.name).up is not False]
        for n in names
    }
    found = await cards(request.app[SESSION], wanted)
    return [found.get(n) or _model(n) for n in names]


async def list_models(request: web.Request) -> web.Response:
    await authenticate(request)
    names = sorted(_offered(request))
    return _json({"object": "list", "data": await _cards(request, names)})


async def retrieve_model(request: web.Request) -> web.Response:
    await authenticate(request)
    name = request.match_info["model"]
    if name not in _offered(request):
        raise ModelNotFound(name)
    [card] = await _cards(request, [name])
    return _json(card)


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
