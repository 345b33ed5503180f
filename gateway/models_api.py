"""`GET /v1/models` and `GET /v1/models/{model}`: the models the authenticated tenant may use.

Invariant: a tenant sees only its own models; retrieving any other model, unknown or served to
others, answers the same 404 `model_not_found` the proxied paths answer.
"""

from __future__ import annotations

import orjson
from aiohttp import web

from gateway.errors import ModelNotFound
from gateway.filters.authn import authenticate
from gateway.state import RUNTIME, TENANT


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "kvfence"}


def _json(data: object) -> web.Response:
    return web.Response(body=orjson.dumps(data), content_type="application/json")


async def list_models(request: web.Request) -> web.Response:
    await authenticate(request)
    names = sorted(request[RUNTIME].allowed[request[TENANT].id])
    return _json({"object": "list", "data": [_model(n) for n in names]})


async def retrieve_model(request: web.Request) -> web.Response:
    await authenticate(request)
    name = request.match_info["model"]
    if name not in request[RUNTIME].allowed[request[TENANT].id]:
        raise ModelNotFound(name)
    return _json(_model(name))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
