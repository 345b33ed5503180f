"""Serving an app: the runner settings that bound what a client may hold, and the edge.

Invariant: an idle or trickling client is cut after `header_timeout_s` (aiohttp's keep-alive
deadline also covers a connection whose request headers are incomplete), connections beyond
`max_connections` are closed at once, a client disconnect cancels its handler, and every
request passes `gateway.edge` before the app routes it.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.admin import create_admin_app
from gateway.app import WATCH
from gateway.edge import ServerLog, guard
from gateway.state import EDGE, HOLDER


def _cap_connections(server: web.Server, limit: int) -> None:
    original = server.connection_made

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        original(handler, transport)
        if len(server.connections) > limit:
            handler.force_close()
            transport.close()

    setattr(server, "connection_made", connection_made)  # noqa: B010


async def start(
    app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> web.AppRunner:
    """Start serving; `bound_port(runner)` tells which port (pass 0 for any)."""
    limits = app[HOLDER].runtime.policy.gateway.limits
    edge = app[EDGE]
    runner = web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        keepalive_timeout=limits.header_timeout_s,
        logger=ServerLog(edge),
    )
    await runner.setup()
    assert runner.server is not None
    _cap_connections(runner.server, limits.max_connections)
    guard(runner.server, edge)
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None, backlog=1024)
    await site.start()
    return runner


async def start_admin(
    app: web.Application, host: str, port: int, *, reuse_port: bool = False
) -> web.AppRunner:
    """Start the admin listener for gateway `app` (its own port; see gateway.admin)."""
    runner = web.AppRunner(create_admin_app(app, app[WATCH]), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
    await site.start()
    return runner


def bound_port(runner: web.AppRunner) -> int:
    return int(runner.addresses[0][1])
