"""Adapter step: the upstream headers, the backend's namespace injection, usage for streams, and
the exact upstream body bytes (which a kvfence handle is then signed over).

Invariant: `UPSTREAM_BODY` is the last form of the body: nothing changes what is sent after it;
the backend gets the gateway's own request id, fresh for each attempt (the client's
`x-request-id` stays in the gateway's log and audit record, never upstream).
"""

from __future__ import annotations

from aiohttp import web

from gateway import entropy
from gateway.inputs import jsonbody
from gateway.inputs.paths import CHAT, COMPLETIONS, UNCACHED
from gateway.inputs.stream_options import ask_for_usage, usage_asked
from gateway.metrics import METRICS
from gateway.policy.tenant_model import Scope
from gateway.state import (
    BODY,
    NAMESPACE,
    PUBLIC,
    ROUTE,
    RUNTIME,
    TENANT,
    UPSTREAM_BODY,
    UPSTREAM_HEADERS,
    USAGE_ASKED,
)


async def inject(request: web.Request) -> None:
    route, body = request[ROUTE], request[BODY]
    headers = {"content-type": "application/json", "x-request-id": entropy.token_hex(16)}
    if route.backend.api_key is not None:
        headers["authorization"] = "Bearer " + route.backend.api_key.value.decode()
    ns = request[NAMESPACE]
    cached = request.path not in UNCACHED  # the tokenizer paths reach no cache: nothing to scope
    if cached:
        route.adapter.inject(request.path, body, headers, ns)
    if route.adapter.scoped and cached:
        metrics = request.app[METRICS]
        metrics.child(metrics.namespaces_injected, route.backend.name).inc()
    streaming = body.get("stream") is True and request.path in (CHAT, COMPLETIONS)
    # The gateway asks for nothing extra in any other answer: what usage it has, the client gets.
    request[USAGE_ASKED] = usage_asked(body) if streaming else True
    if streaming:
        ask_for_usage(body)
    data = jsonbody.dumps(body)
    tenant = request[TENANT]
    share = request[RUNTIME].shares.get(tenant.id)
    ephemeral = tenant.scope is Scope.REQUEST
    route.adapter.bind(data, body, headers, ns, share, request.get(PUBLIC, ()), ephemeral)
    request[UPSTREAM_BODY] = data
    request[UPSTREAM_HEADERS] = headers
