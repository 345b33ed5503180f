"""Namespace: the tenant's scope value (none, user or session) and the derived namespace.

A tenant can narrow its namespace (user, session, request) but never leave it: the tenant id is
always part of the derivation, and a missing user or session id is refused rather than widened;
scope `request` takes a fresh random value each time. The tokenizer paths, which reach no cache,
need no scope value: their namespace (never sent) is the tenant's, for the record and routing.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from typing import Any, Final

from aiohttp import web

from gateway.errors import MissingScopeValue
from gateway.inputs.paths import UNCACHED
from gateway.policy.tenant_model import Scope, Tenant
from gateway.state import BODY, NAMESPACE, PROMPT_CACHE_KEY, ROUTE, RUNTIME, SCOPE_VALUE, TENANT

MAX_SCOPE_VALUE: Final = 512


def _scope_value(tenant: Tenant, body: dict[str, Any], request: web.Request) -> str:
    if tenant.scope is Scope.TENANT:
        return ""
    if tenant.scope is Scope.REQUEST:
        return secrets.token_hex(16)  # a namespace no other request will ever derive
    value = request.headers.get(tenant.scope_header) if tenant.scope_header else None
    if not value:
        value = body.get("user") if tenant.scope is Scope.USER else request.get(PROMPT_CACHE_KEY)
    if not isinstance(value, str) or not value or len(value) > MAX_SCOPE_VALUE:
        field = "user" if tenant.scope is Scope.USER else "prompt_cache_key"
        where = f" or header {tenant.scope_header}" if tenant.scope_header else ""
        raise MissingScopeValue(
            f"this tenant's cache scope is {tenant.scope.value}: send {field}{where} "
            f"(1 to {MAX_SCOPE_VALUE} characters)",
            param=field,
        )
    return value


async def derive(request: web.Request) -> None:
    tenant = request[TENANT]
    if request.path in UNCACHED:  # the tokenizer reaches no cache: the tenant's own label
        tenant, value = replace(tenant, scope=Scope.TENANT), ""
    else:
        value = _scope_value(tenant, request[BODY], request)
    request[SCOPE_VALUE] = value
    request[NAMESPACE] = request[RUNTIME].namespace(tenant, value, request[ROUTE])
