"""The admin listener: operational endpoints on their own port (loopback by default), never on
the tenant listener. `GET /status` (readiness, each backend's health check and verification
state) and `GET /metrics` need the admin token when one is set; actions (`POST /reload`,
`POST /canary/{backend}`, `POST /quarantine/{backend}/release`) and the tenant registry's routes
(`gateway.registry.admin`: tenants and keys) always need it. The witnessed logs' routes
(`gateway.api.log`: every log, for the operator's witnesses) need it to hand back a cosignature.

Invariant: no tenant API key opens anything here, and no route here exists on the tenant port.
"""

from __future__ import annotations

import hmac
import os
import signal
import time
from collections.abc import Awaitable, Callable

import orjson
from aiohttp import web

from gateway.api.log import admin_checkpoint, admin_cosignature, admin_list_logs
from gateway.errors import GatewayError
from gateway.metrics import METRICS
from gateway.policy.prefixes import backend_status as public_status
from gateway.policy.reload import HOLDER, RELOADER
from gateway.registry.admin import add_routes as add_registry_routes
from gateway.routing.liveness import LIVENESS
from gateway.routing.replicas import REPLICAS
from gateway.shared import SHARED
from gateway.verify.service import VERIFY
from gateway.verify.watch import WATCH

GATEWAY = web.AppKey("kvfence_gateway_app", web.Application)
WORKER = web.AppKey("kvfence_admin_under_supervisor", bool)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: object, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(status: int, code: str, message: str, **extra: object) -> web.Response:
    error = {"message": message, "type": "admin_error", "code": code, **extra}
    return _json({"error": error}, status)


@web.middleware
async def authorize(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[GATEWAY][HOLDER].runtime.policy.gateway.admin.token
    if token is None:
        if request.method != "GET":
            return _error(403, "admin_token_required", "set gateway.admin.token to allow actions")
        return await handler(request)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.value):
        return _error(401, "invalid_admin_token", "send Authorization: Bearer <admin token>")
    return await handler(request)


async def status(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    policy = gateway[HOLDER].runtime.policy
    board, liveness, watch = gateway[VERIFY].health, gateway[LIVENESS], gateway[WATCH]
    await watch.reach.read(policy)
    now, mono = time.time(), time.monotonic()
    reasons: dict[str, dict[str, int]] = {}
    for labels, value in gateway[METRICS].totals("kvfence_gateway_verdict_reasons"):
        why = reasons.setdefault(labels["backend"], {})
        why[f"{labels['verdict']}:{labels['reason']}"] = int(value)
    backends = {}
    for backend in policy.backends:
        health, live = board.get(backend.name), liveness.get(backend.name)
        canary = backend.verify.canary if backend.verify else None
        backends[backend.name] = {
            "kind": backend.kind,
            "url": backend.url,
            "models": [m.name for m in backend.models],
            "up": bool(live.up),
            "required": backend.required,
            "health_check": live.as_json(),
            "verified": backend.verify is not None,
            "public_prefixes": public_status(policy, backend),
            **health.as_json(),
            "canary_age_s": round(now - health.canary_at, 1) if health.canary_at else None,
            "canary_due_at": round(watch.due_at(health, canary), 3) if canary else None,
            "verdict_reasons": reasons.get(backend.name, {}),
            "weight": backend.weight,
            "passive": gateway[REPLICAS].passive(backend.name).as_json(mono),
        }
    down = liveness.down(policy)
    store = gateway.get(SHARED)
    shared = None if store is None else {"up": store.up, "since": store.since,
                                         "on_failure": store.settings.on_failure.value}  # fmt: skip
    return _json(
        {
            "policy": policy.summary(),
            "ready": not down,
            "down": down,
            "backends": backends,
            "history": {
                "shared": gateway.get(SHARED) is not None,
                "block_max_age_s": policy.gateway.history.block_max_age_s,
                "read_at": round(watch.reach.read_at, 3),
                "tenants": watch.reach.status(now),
            },
            "shared": shared,
        }
    )


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY][METRICS].render()
    return web.Response(body=body, content_type="text/plain")


def _backend_name(request: web.Request) -> str | None:
    name = request.match_info["backend"]
    policy = request.app[GATEWAY][HOLDER].runtime.policy
    return name if any(b.name == name for b in policy.backends) else None


async def canary(request: web.Request) -> web.Response:
    name = _backend_name(request)
    policy = request.app[GATEWAY][HOLDER].runtime.policy
    backend = next((b for b in policy.backends if b.name == name), None)
    if backend is None or backend.verify is None or backend.verify.canary is None:
        return _error(404, "no_canary", "no such backend with canaries")
    results = await request.app[GATEWAY][WATCH].round(backend, "operator")
    health = request.app[GATEWAY][VERIFY].health.get(backend.name)
    rounds = [
        {"model": r.model, **r.evidence(), "reason": r.reason, "requests": r.requests}
        for r in results
    ]
    return _json({"backend": backend.name, "rounds": rounds, "health": health.as_json()})


async def release(request: web.Request) -> web.Response:
    name = _backend_name(request)
    if name is None:
        return _error(404, "no_backend", "no such backend")
    after = await request.app[GATEWAY][WATCH].release(name)
    return _json({"backend": name, "health": after.as_json()})


async def reload(request: web.Request) -> web.Response:
    """Reload the policy file now: 200 with its summary, or 422 with every error (the running
    policy stays). Under `--workers`, the supervisor is asked (SIGHUP) to reload every worker."""
    gateway = request.app[GATEWAY]
    reloader = gateway.get(RELOADER)
    if reloader is None:
        return _error(404, "no_policy_file", "this gateway was not started from a policy file")
    if not await reloader.reload():
        message = "policy reload refused; the running policy stays"
        return _error(422, "policy_invalid", message, errors=reloader.errors)
    if request.app[WORKER]:
        os.kill(os.getppid(), signal.SIGHUP)  # the supervisor forwards it to every worker
    return _json({"reloaded": True, "policy": gateway[HOLDER].runtime.policy.summary()})


def _witnessed(
    handler: Callable[[web.Request, web.Application], Awaitable[web.Response]],
) -> Handler:
    """A witnessed log's route on the admin listener (every log: the audit log's chains and each
    tenant's receipt log), its refusals in the admin listener's error shape."""

    async def route(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request, request.app[GATEWAY])
        except GatewayError as exc:
            return _error(exc.status, exc.code, exc.message)

    return route


def create_admin_app(gateway: web.Application, worker: bool = False) -> web.Application:
    """The admin app for `gateway`; `worker` when it runs under the `--workers` supervisor."""
    app = web.Application(middlewares=[authorize])
    app[GATEWAY] = gateway
    app[WORKER] = worker
    app.router.add_post("/reload", reload)
    app.router.add_get("/status", status)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/canary/{backend}", canary)
    app.router.add_post("/quarantine/{backend}/release", release)
    app.router.add_get("/v1/kvfence/log", _witnessed(admin_list_logs))
    app.router.add_get("/v1/kvfence/log/checkpoint", _witnessed(admin_checkpoint))
    app.router.add_post("/v1/kvfence/log/cosignature", _witnessed(admin_cosignature))
    add_registry_routes(app, gateway)
    return app
