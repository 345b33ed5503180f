"""The body allowlist step (after scrub): the body keeps only what the route's backend may get
(`gateway.inputs.allowlist`).

Invariant: no name in `fields.NEVER` reaches the adapter step, whatever the policy allows.
"""

from __future__ import annotations

from aiohttp import web

from gateway.inputs.allowlist import account, prune
from gateway.metrics import METRICS
from gateway.policy.model import UnknownFieldMode
from gateway.state import BODY, ROUTE, RUNTIME


async def allow_fields(request: web.Request) -> None:
    backend = request[ROUTE].backend
    dropped = prune(request.path, request[BODY], backend.extra_fields)
    if dropped:  # the policy's mode matters only then
        reject = request[RUNTIME].policy.gateway.unknown_fields is UnknownFieldMode.REJECT
        account(dropped, backend.name, reject, request.app[METRICS])
