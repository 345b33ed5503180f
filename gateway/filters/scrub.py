"""Client cache-scoping inputs: stripped (default) or rejected with 400, per the policy.

Invariant: after this step no client-chosen scoping field or header is left in the request; a
session-scoped tenant's `prompt_cache_key` is taken as its session id (for the namespace step),
never forwarded.
"""

from __future__ import annotations

from aiohttp import web

from gateway.errors import ClientInputRejected
from gateway.inputs.scoping import scoping_headers, strip_body
from gateway.metrics import METRICS
from gateway.policy.model import ClientInputMode
from gateway.policy.tenant_model import Scope
from gateway.state import BODY, PROMPT_CACHE_KEY, RUNTIME, TENANT


async def scrub_client_inputs(request: web.Request) -> None:
    body, tenant = request[BODY], request[TENANT]
    if tenant.scope is Scope.SESSION and "prompt_cache_key" in body:
        request[PROMPT_CACHE_KEY] = body.pop("prompt_cache_key")
    # Headers are never forwarded (the proxy sends only its own), so finding them is enough.
    found = scoping_headers(request.headers.keys()) + strip_body(body)
    if not found:
        return
    mode = request[RUNTIME].policy.gateway.client_inputs
    counter = request.app[METRICS].client_inputs
    for name in found:
        counter.labels(tenant.id, name, mode.value).inc()
    if mode is ClientInputMode.REJECT:
        raise ClientInputRejected(
            f"cache-scoping input {found[0]!r} is not accepted; the gateway sets the namespace",
            param=found[0],
        )
