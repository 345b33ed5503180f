"""Connection pressure on the tenant listener: how many connections it holds, per client address
and in all, and which one gives way when it is full.

Invariant: at a cap, a new connection is admitted by closing the connection that has waited
longest without a request in progress (an idle keep-alive, or a client still trickling its
headers); only when every connection is busy is the newcomer refused, and then with a 503 and
`Retry-After`, never a silent close. A request in progress is never cut for room.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.metrics import Metrics

_BODY: Final = b'{"error":{"message":"the gateway holds as many connections as it may; retry shortly","type":"server_error","code":"overloaded"}}'  # noqa: E501
REFUSED: Final = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY
)


@dataclass(slots=True)
class _Conn:
    peer: str
    since: float  # when it opened, or its last request ended
    transport: asyncio.Transport
    busy: int = 0


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
            if conn is None:
                return await handle(request)
            conn.busy += 1
            try:
                return await handle(request)
            finally:
                conn.busy -= 1
                conn.since = time.monotonic()

        setattr(server, "connection_made", connection_made)  # noqa: B010
        setattr(server, "connection_lost", connection_lost)  # noqa: B010
        server.request_handler = request_handler

    def _admit(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = str((transport.get_extra_info("peername") or ("?",))[0])
        if self._peers.get(peer, 0) >= self.per_client and not self._reclaim(peer):
            self._refuse(handler, transport, "per_client")
            return
        if len(self._conns) >= self.limit and not self._reclaim(None):
            self._refuse(handler, transport, "total")
            return
        self._conns[handler] = _Conn(peer, time.monotonic(), transport)
        self._peers[peer] = self._peers.get(peer, 0) + 1

    def _reclaim(self, peer: str | None) -> bool:
        """Close the longest-waiting connection without a request in progress (of `peer`, or
        of anyone); False when every candidate is busy."""
        idle = [(c.since, h) for h, c in self._conns.items()
                if not c.busy and (peer is None or c.peer == peer)]  # fmt: skip
        if not idle:
            return False
        _, victim = min(idle, key=lambda pair: pair[0])
        conn = self._conns[victim]
        self._forget(victim)
        victim.force_close()
        conn.transport.close()
        self.metrics.connections_reclaimed.inc()
        return True

    def _refuse(self, handler: RequestHandler, transport: asyncio.Transport, why: str) -> None:
        self.metrics.child(self.metrics.connections_refused, why).inc()
        transport.write(REFUSED)
        handler.force_close()
        transport.close()

    def _forget(self, handler: RequestHandler) -> None:
        conn = self._conns.pop(handler, None)
        if conn is not None:
            left = self._peers[conn.peer] - 1
            if left:
                self._peers[conn.peer] = left
            else:
                del self._peers[conn.peer]
