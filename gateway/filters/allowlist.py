"""The body allowlist step (after scrub): the body keeps only what the route's backend may get
(`gateway.inputs.allowlist`).

Invariant: no name in `fields.NEVER` reaches the adapter step, whatever the policy allows.
"""

from __future__ import annotations

from aiohttp import web

from gateway.inputs.allowlist import enforce
from gateway.metrics import METRICS
from gateway.policy.model import UnknownFieldMode
from gateway.state import BODY, ROUTE, RUNTIME


async def allow_fields(request: web.Request) -> None:
    backend = request[ROUTE].backend
    reject = request[RUNTIME].policy.gateway.unknown_fields is UnknownFieldMode.REJECT
    enforce(
        request.path,
        request[BODY],
        backend.name,
        backend.extra_fields,
        reject,
        request.app[METRICS],
    )
