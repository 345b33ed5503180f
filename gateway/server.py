"""Serving an app: the runner settings that bound what a client may hold, and the edge.

Invariant: an idle or trickling client is cut after `header_timeout_s` (aiohttp's keep-alive
deadline also covers a connection whose request headers are incomplete), a connection over the
caps waits until its request arrives, then is admitted or answered 503
(`gateway.listener.connections`, which tells clients apart by the tenant their key
authenticates), a client disconnect cancels its handler, and every request passes
`gateway.listener.edge` before the app routes it.
"""

from __future__ import annotations

from aiohttp import web

from gateway.admin import create_admin_app
from gateway.filters.authn import presented_key
from gateway.listener.connections import PRESSURE, Identify, Pressure
from gateway.listener.edge import EDGE, ServerLog, guard
from gateway.metrics import METRICS
from gateway.policy.reload import HOLDER, PolicyHolder
from gateway.policy.runtime import Identity


def identify(holder: PolicyHolder) -> Identify:
    """Who a request's key is (the connection caps' fairness; authentication takes it), or None
    when it presents none."""

    def identity_of(request: web.BaseRequest) -> Identity | None:
        key = presented_key(request)
        return None if key is None else holder.runtime.identify(key)

    return identity_of


async def start(
    app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> web.AppRunner:
    """Start serving; `bound_port(runner)` tells which port (pass 0 for any)."""
    limits = app[HOLDER].runtime.policy.gateway.limits
    edge = app[EDGE]
    pressure = app[PRESSURE] = Pressure(
        limits.max_connections,
        limits.max_connections_per_client,
        app[METRICS],
        identify(app[HOLDER]),
    )

    async def stop_ticking(_app: web.Application) -> None:
        pressure.close()

    app.on_cleanup.append(stop_ticking)
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=limits.header_timeout_s,
        logger=ServerLog(edge),
    )
    await runner.setup()
    assert runner.server is not None
    guard(runner.server, edge)
    pressure.install(runner.server)
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    return runner


async def start_admin(
    app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> web.AppRunner:
    """Start the admin listener for gateway `app` (its own port; see gateway.admin).
    `reuse_port` means a worker under the `--workers` supervisor, which shares the port."""
    admin = create_admin_app(app, worker=reuse_port)
    runner = web.AppRunner(admin, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return int(runner.addresses[0][1])
