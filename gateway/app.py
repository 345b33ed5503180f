"""The gateway application: routes, the filter chain, error mapping, metrics and access log.

Invariant: every proxied request passes authn -> limit -> body -> route -> scrub -> allowlist ->
namespace -> replica -> public -> adapter before the terminal step (`routing.failover`, which
relays it), against one policy snapshot; any other path answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from gateway import entropy
from gateway.api.log import add_log_routes
from gateway.api.models import add_routes
from gateway.api.receipts import add_receipt_routes
from gateway.audit.sink import AUDIT_SINK, AuditSink, audit_sink_ctx
from gateway.audit.trace import TRACES, Traces
from gateway.control.engine import ControlUnavailable as DatabaseDown
from gateway.control.service import CONTROL, open_control
from gateway.control.store import Decision
from gateway.errors import CLIENT_CLOSED, GatewayError, NotFound, Overloaded, error_response
from gateway.filters.adapter import inject
from gateway.filters.allowlist import allow_fields
from gateway.filters.authn import authenticate
from gateway.filters.body import read_body
from gateway.filters.budget import reserve
from gateway.filters.limit import admit
from gateway.filters.namespace import derive
from gateway.filters.public import split_public
from gateway.filters.replica import pick_replica
from gateway.filters.route import choose_route
from gateway.filters.scrub import scrub_client_inputs
from gateway.fleet import decisions
from gateway.fleet.budgeter import BUDGETS, Budgeter
from gateway.fleet.limiter import LIMITER, Limiter
from gateway.fleet.local_health import HealthCollector
from gateway.fleet.local_limits import LIMITS, SharedLimits
from gateway.fleet.metrics import FLEET_METRICS, FleetMetrics
from gateway.inputs.paths import PROXIED_PATHS
from gateway.listener.edge import EDGE, Edge
from gateway.listener.load import IN_FLIGHT, InFlight, busy
from gateway.metrics import METRICS, Metrics
from gateway.observe import failed, finish
from gateway.policy.model import Policy
from gateway.policy.reload import HOLDER, RELOADER, PolicyHolder, Reloader, reload_ctx
from gateway.policy.runtime import Runtime
from gateway.receipts.service import RECEIPTS, Receipts, receipts_ctx
from gateway.registry.admin import SPEND, open_registry
from gateway.relay.headers import keep_content_type
from gateway.relay.session import SESSION, session_ctx
from gateway.routing.failover import failover
from gateway.routing.liveness import LIVENESS, Liveness, LivenessCollector, readyz
from gateway.routing.replicas import REPLICAS, Replicas
from gateway.shared import open_shared
from gateway.state import (
    ADMISSION,
    ADMITTED,
    API_KEY,
    RECEIPT_ID,
    REQUEST_ID,
    RESERVATION,
    ROUTE,
    RUNTIME,
    TENANT,
    TIMING,
    USED_TOKENS,
    Filter,
    Timing,
)
from gateway.verify.reach import ReachCollector
from gateway.verify.service import VERIFY, Verification, remove_state_dir, state_dir_for
from gateway.verify.watch import WATCH, Watch
from kvfence.logs import redact_headers
from kvfence.receipts.receipt import RECEIPT_HEADER

CHAIN: Final[tuple[Filter, ...]] = (
    authenticate,
    admit,
    read_body,
    choose_route,
    reserve,
    scrub_client_inputs,
    allow_fields,
    derive,
    pick_replica,
    split_public,
    inject,
)
# The chain's steps whose outcome depends on the backend: a failover runs them again.
RESCOPE: Final[tuple[Filter, ...]] = (split_public, inject)
_RID_RE: Final = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
log = logging.getLogger("kvfence.gateway")


async def proxied(request: web.Request) -> web.StreamResponse:
    held, cap = request.app[IN_FLIGHT], request[RUNTIME].policy.gateway.limits.max_in_flight
    metrics = request.app[METRICS]
    held.cap = cap
    if held.count >= cap:
        metrics.overloaded.inc()
        raise Overloaded("the gateway is at its in-flight limit; retry shortly", 1.0)
    held.count += 1
    try:
        for step in CHAIN:
            await step(request)
        route = request[ROUTE]
        in_flight = metrics.child(metrics.in_flight, request[TENANT].id, route.model.name)
        in_flight.inc()
        try:
            return await failover(request, RESCOPE)
        finally:
            in_flight.dec()
    finally:
        held.count -= 1


async def healthz(request: web.Request) -> web.Response:
    """Liveness: 200 whenever this worker answers, busy included (a restart would not make it
    less busy); the body says which caps are reached."""
    at = busy(request.app)
    return web.Response(text=f"ok, busy: {', '.join(at)}\n" if at else "ok\n")


@web.middleware
async def frame(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    timing = Timing(time.perf_counter())
    request[TIMING] = timing
    request[RUNTIME] = request.app[HOLDER].runtime
    rid = request.headers.get("x-request-id", "")
    request[REQUEST_ID] = rid = rid if _RID_RE.fullmatch(rid) else entropy.token_hex(16)
    status = 500
    if log.isEnabledFor(logging.DEBUG):
        log.debug("request", extra={"rid": rid, "headers": redact_headers(request.headers.items())})
    try:
        response = await handler(request)
        status = response.status
        response.headers.setdefault("x-request-id", rid)
        return response
    except asyncio.CancelledError:
        status = CLIENT_CLOSED  # the client went away; its upstream request was cancelled too
        raise
    except GatewayError as exc:
        status = exc.status
        failed(request, exc)
        receipt = request.get(RECEIPT_ID)  # an exchange settled with this error has a receipt
        return error_response(exc, rid, headers={RECEIPT_HEADER: receipt} if receipt else None)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
        status = 404
        return error_response(NotFound(f"no route for {request.method} {request.path}"), rid)
    finally:
        if request.get(ADMITTED):
            tokens = request.get(USED_TOKENS, 0)
            request.app[LIMITER].release(request[TENANT], request.get(ADMISSION), tokens)
        reservation = request.get(RESERVATION)
        if reservation is not None:  # charged before the next request of this client is read
            settled = request.app[BUDGETS].settle(reservation, request.get(USED_TOKENS, 0))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(settled)
        if request.get(USED_TOKENS):
            _spend(request, request[USED_TOKENS])
        finish(request, status, timing)


def _spend(request: web.Request, tokens: int) -> None:
    """Count an answer's tokens per key."""
    tenant, key = request[TENANT], request.get(API_KEY)
    if key is not None:
        metrics = request.app[METRICS]
        metrics.child(metrics.key_tokens, tenant.id, key.id).inc(tokens)


async def _budgets_ctx(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[BUDGETS].run())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await app[BUDGETS].drain()


def _verify_ctx(temporary: bool) -> Callable[[web.Application], AsyncIterator[None]]:
    """The shared health board's refresher and the canary watch run while the app serves."""

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        verification = app[VERIFY]
        with contextlib.suppress(DatabaseDown):  # before the first request: no unquarantined start
            await decisions.load(app[CONTROL], verification.health)
        tasks = [
            asyncio.create_task(decisions.follow(app[CONTROL], verification.health)),
            asyncio.create_task(verification.health.watch()),
            asyncio.create_task(app[WATCH].run()),
            asyncio.create_task(app[LIVENESS].run(app)),
        ]
        yield
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        verification.close()
        app[LIMITS].close()
        if temporary:
            remove_state_dir(verification.state_dir)

    return ctx


async def _traces_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await asyncio.to_thread(app[TRACES].close)  # the spans still queued are sent


def create_app(
    policy: Policy,
    *,
    reload_from: Path | None = None,
    reload_interval_s: float = 1.0,
    worker: int | None = None,
    state_dir: Path | None = None,
    generation: float | None = None,
    shared_metrics: Path | None = None,
) -> web.Application:
    """The gateway for `policy`; with `reload_from`, it follows that file and SIGHUP. `worker`
    numbers one of several processes sharing the port (it writes its own audit log chain);
    `state_dir` is the state they share (verification, tenant limits; default: the policy's,
    else a private temporary one), `generation` names their start (limits left by an
    earlier start are reset), and `shared_metrics` the folder their metric values share."""
    app = web.Application(middlewares=[frame])
    app[HOLDER] = PolicyHolder(Runtime(policy))
    app[METRICS] = Metrics(shared_metrics)
    app[FLEET_METRICS] = FleetMetrics(app[METRICS])
    app[LIVENESS] = Liveness()
    app[EDGE] = Edge(app[METRICS])
    app[AUDIT_SINK] = AuditSink(policy.gateway.audit_log, worker)
    temporary = False
    if state_dir is None:
        state_dir, temporary = state_dir_for(policy)
    app[VERIFY] = Verification(policy, state_dir)
    shared_limits = open_shared(app, policy)  # gateway.shared: health and limits in Redis
    control = open_control(app, policy, state_dir)  # what must last: SQLite or PostgreSQL
    app[RECEIPTS] = Receipts(control)  # receipts and their logs: in the control database
    open_registry(app, policy, state_dir)  # registry: tenants and keys, in the control database

    def backends() -> list[str]:
        return [b.name for b in app[HOLDER].runtime.policy.backends]

    app[METRICS].add_collector(HealthCollector(app[VERIFY].health, backends))
    app[METRICS].add_collector(LivenessCollector(app[LIVENESS], app[HOLDER]))
    app[LIMITS] = SharedLimits(state_dir / "limits.bin", generation or time.time())
    app[IN_FLIGHT] = InFlight()
    app[LIMITER] = Limiter(app[LIMITS], shared_limits)
    app[BUDGETS] = app[SPEND] = Budgeter(control)  # `kvfence tenants list` shows the spend
    app.cleanup_ctx.append(_budgets_ctx)
    app[REPLICAS] = Replicas()

    async def record(entry: dict[str, Any]) -> None:
        await app[AUDIT_SINK].event(app[HOLDER].runtime.policy.gateway.audit_log, entry)
        if entry.get("event") in ("quarantine", "release"):  # what must outlast every restart
            quarantined = entry["event"] == "quarantine"
            decision = Decision(entry["backend"], quarantined, entry["reason"], entry["time"])
            await decisions.decide(control, app[VERIFY].health, decision)

    app[WATCH] = Watch(app[HOLDER], app[VERIFY], app[METRICS], lambda: app[SESSION], record)
    app[METRICS].add_collector(ReachCollector(app[WATCH].reach))
    if policy.gateway.tracing is not None:  # the otel extra; off by default
        app[TRACES] = Traces(policy.gateway.tracing)
        app.cleanup_ctx.append(_traces_ctx)
    app.cleanup_ctx.append(session_ctx)
    app.on_response_prepare.append(keep_content_type)
    app.cleanup_ctx.append(audit_sink_ctx)
    app.cleanup_ctx.append(receipts_ctx)
    app.cleanup_ctx.append(_verify_ctx(temporary))
    if reload_from is not None:
        reloader = Reloader(reload_from, app[HOLDER], app[METRICS], reload_interval_s)
        app[RELOADER] = reloader
        app.cleanup_ctx.append(reload_ctx(reloader))
    for path in sorted(PROXIED_PATHS):
        app.router.add_post(path, proxied)
    add_routes(app)
    add_receipt_routes(app)
    add_log_routes(app)
    app.router.add_get("/healthz", healthz)  # the two PROBES: answered whatever the caps
    app.router.add_get("/readyz", readyz)
    return app
