"""Connection pressure on the tenant listener: how many connections it holds, per client address
and in all, and which one gives way when it is full.

Invariant: at a cap, a newcomer is admitted by closing the longest-waiting connection that has
no request in progress (a client still trickling its headers, or an idle keep-alive) and is
older than `GRACE_S`; a connection whose request headers have arrived is never closed for room.
When none can give way, the newcomer is answered 503 with `Retry-After` through the normal HTTP
path once its request arrives (so the answer is read, not lost to a reset); only past
`OVERFLOW` such connections is one closed unanswered.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import Overloaded, error_response
from gateway.metrics import Metrics

GRACE_S = 0.05  # a new connection's time to send its request before it may be closed for room
OVERFLOW = 1024  # connections over the cap kept just long enough to answer them 503


@dataclass(slots=True)
class _Conn:
    peer: str
    since: float  # when it opened, or its last request ended
    transport: asyncio.Transport
    finished: int = 0  # requests answered on it
    refusing: bool = False  # over the cap: its request is answered 503


class Pressure:
    def __init__(self, limit: int, per_client: int, metrics: Metrics) -> None:
        self.limit, self.per_client, self.metrics = limit, per_client, metrics
        self._conns: dict[RequestHandler, _Conn] = {}
        self._peers: dict[str, int] = {}

    def install(self, server: web.Server) -> None:
        made, lost, handle = server.connection_made, server.connection_lost, server.request_handler

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._admit(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None) -> None:
            lost(handler, exc)
            self._forget(handler)

        async def request_handler(request: web.BaseRequest) -> web.StreamResponse:
            conn = self._conns.get(request.protocol)
            if conn is not None and conn.refusing:
                return _overloaded()
            try:
                return await handle(request)
            finally:
                if conn is not None:
                    conn.finished += 1
                    conn.since = time.monotonic()

        setattr(server, "connection_made", connection_made)  # noqa: B010
        setattr(server, "connection_lost", connection_lost)  # noqa: B010
        server.request_handler = request_handler

    def _admit(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = str((transport.get_extra_info("peername") or ("?",))[0])
        refusing = self._peers.get(peer, 0) >= self.per_client and not self._reclaim(peer)
        if not refusing and len(self._conns) >= self.limit:
            refusing = not self._reclaim(None)
        if refusing:
            self.metrics.child(self.metrics.connections_refused, "answered").inc()
            if len(self._conns) >= self.limit + max(self.limit, OVERFLOW):  # no room to answer
                self.metrics.child(self.metrics.connections_refused, "closed").inc()
                handler.force_close()
                transport.close()
                return
        self._conns[handler] = _Conn(peer, time.monotonic(), transport, refusing=refusing)
        self._peers[peer] = self._peers.get(peer, 0) + 1

    @staticmethod
    def _busy(handler: RequestHandler, conn: _Conn) -> bool:
        """A request was parsed on it and is not answered yet. aiohttp counts parsed requests
        as they arrive, in the transport's callback, before the request is even scheduled, so
        a flood of newcomers cannot push out a client that has sent its headers."""
        return int(getattr(handler, "_request_count", 0)) > conn.finished

    def _reclaim(self, peer: str | None) -> bool:
        """Close the longest-waiting connection without a request in progress, past its grace
        (of `peer`, or of anyone); False when there is none."""
        old = time.monotonic() - GRACE_S
        idle = [(c.since, h) for h, c in self._conns.items()
                if c.since < old and not self._busy(h, c) and peer in (None, c.peer)]  # fmt: skip
        if not idle:
            return False
        _, victim = min(idle, key=lambda item: item[0])
        conn = self._conns[victim]
        self._forget(victim)
        victim.force_close()
        conn.transport.close()
        self.metrics.connections_reclaimed.inc()
        return True

    def _forget(self, handler: RequestHandler) -> None:
        conn = self._conns.pop(handler, None)
        if conn is not None:
            left = self._peers[conn.peer] - 1
            if left:
                self._peers[conn.peer] = left
            else:
                del self._peers[conn.peer]


def _overloaded() -> web.Response:
    error = Overloaded("the gateway holds as many connections as it may; retry shortly", 1.0)
    return error_response(error, close=True)  # closes once the answer is out
