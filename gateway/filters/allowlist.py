"""The body allowlist step (after scrub): the body keeps only what the route's backend may get
(`gateway.inputs.allowlist`); a field it may not get is refused with 400 naming it, unless the
policy says to drop it.

Invariant: no name in `fields.NEVER` or `fields.REFUSED` reaches the adapter step, whatever the
policy allows.
"""

from __future__ import annotations

from aiohttp import web

from gateway.inputs.allowlist import account, prune
from gateway.metrics import METRICS
from gateway.state import BODY, ROUTE, RUNTIME


async def allow_fields(request: web.Request) -> None:
    backend = request[ROUTE].backend
    pruned = prune(request.path, request[BODY], backend.kind, backend.extra_fields)
    if pruned:  # the policy's modes matter only then
        modes = request[RUNTIME].policy.gateway.field_modes
        account(pruned, backend.kind, backend.name, modes, request.app[METRICS])
