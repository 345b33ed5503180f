"""Replica step: among the model's backends that serve this path, the one that holds this
namespace's cache (weighted rendezvous hashing), skipping quarantined, down and ejected ones,
and the next ones a retry may use.

Invariant: `ROUTE` is never a quarantined backend; a model with one backend keeps the route
`choose_route` picked, unchanged.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import BackendQuarantined
from gateway.inputs import jsonbody
from gateway.policy.runtime import Route
from gateway.routing.liveness import LIVENESS
from gateway.routing.replicas import REPLICAS
from gateway.routing.retarget import retarget
from gateway.state import BODY, CANDIDATES, NAMESPACE, ROUTE, RUNTIME, UNSCOPED_BODY
from gateway.verify.service import VERIFY


def candidates(request: web.Request) -> list[Route]:
    """The model's backends for this request, best first (quarantined ones left out)."""
    runtime, route = request[RUNTIME], request[ROUTE]
    serving = [r for r in runtime.routes[route.model.name] if request.path in r.adapter.paths]
    health, liveness = request.app[VERIFY].health, request.app[LIVENESS]
    return request.app[REPLICAS].order(
        serving,
        request[NAMESPACE],
        runtime.policy.gateway.routing,
        quarantined=lambda name: health.get(name).quarantined,
        down=lambda name: liveness.get(name).up is False,
    )


async def pick_replica(request: web.Request) -> None:
    route = request[ROUTE]
    if len(request[RUNTIME].routes[route.model.name]) < 2:
        request[CANDIDATES] = (route,)
        return
    order = candidates(request)
    if not order:  # quarantined since choose_route looked
        raise BackendQuarantined(
            f"every backend serving model {route.model.name!r} is quarantined after a failed "
            "isolation check"
        )
    tries = tuple(order[: 1 + request[RUNTIME].policy.gateway.routing.retries])
    request[CANDIDATES] = tries
    if tries[0] is not route:
        retarget(request, tries[0])
    if len(tries) > 1:
        request[UNSCOPED_BODY] = jsonbody.dumps(request[BODY])
