"""Authentication: the presented API key must map to exactly one tenant (deny by default); a
registry key opens it only while it is neither revoked nor expired. The listener's connection
caps may have looked the key up already (`IDENTIFIED`): taken as found."""

from __future__ import annotations

from aiohttp import web

from gateway.errors import Unauthenticated
from gateway.listener.connections import IDENTIFIED
from gateway.metrics import METRICS
from gateway.state import API_KEY, RUNTIME, TENANT

_REFUSED = {
    "unknown": "invalid API key",
    "revoked": "this API key was revoked: ask for a new one",
    "expired": "this API key has expired: ask for a new one",
}


def presented_key(request: web.BaseRequest) -> str | None:
    """One key from `Authorization: Bearer` or `x-api-key`; several different ones is none."""
    headers = request.headers
    authorization = headers.getall("authorization", ())
    if len(authorization) == 1 and "x-api-key" not in headers:  # the usual request, quickly
        scheme, _, token = authorization[0].strip().partition(" ")
        token = token.strip()
        return token if scheme.lower() == "bearer" and token else None
    keys: set[str] = set()
    for value in authorization:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            keys.add(token.strip())
        else:
            return None
    keys.update(v.strip() for v in headers.getall("x-api-key", ()) if v.strip())
    return keys.pop() if len(keys) == 1 else None


async def authenticate(request: web.Request) -> None:
    key = presented_key(request)
    if key is None:
        request.app[METRICS].auth_failures.labels("missing").inc()
        raise Unauthenticated("missing API key: send Authorization: Bearer <key> or x-api-key")
    seen = request.get(IDENTIFIED)
    who = seen.identity if seen is not None else None
    if who is None:
        who = request[RUNTIME].identify(key)
    if who.tenant is None:
        request.app[METRICS].auth_failures.labels(who.refused).inc()
        raise Unauthenticated(_REFUSED[who.refused])
    request[TENANT] = who.tenant
    if who.key is not None:
        request[API_KEY] = who.key
