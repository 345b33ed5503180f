"""Client cache-scoping inputs: stripped (default) or rejected with 400, per the policy."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import ClientInputRejected
from gateway.policy import ClientInputMode
from gateway.sanitize import scoping_headers, strip_body
from gateway.state import BODY, METRICS, RUNTIME, TENANT


async def scrub_client_inputs(request: web.Request) -> None:
    # Headers are never forwarded (the proxy sends only its own), so finding them is enough.
    found = scoping_headers(request.headers.keys()) + strip_body(request[BODY])
    if not found:
        return
    mode = request[RUNTIME].policy.gateway.client_inputs
    counter = request.app[METRICS].client_inputs
    tenant = request[TENANT].id
    for name in found:
        counter.labels(tenant, name, mode.value).inc()
    if mode is ClientInputMode.REJECT:
        raise ClientInputRejected(
            f"cache-scoping input {found[0]!r} is not accepted; the gateway sets the namespace"
        )
