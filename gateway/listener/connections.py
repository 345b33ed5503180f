"""Connection pressure on the tenant listener: how many connections may run requests, in all and
per client (the tenant its last request's key authenticates, else its address), who waits and who
gives way.

Invariant: a connection is closed for room only while it holds no request (a client still
trickling its headers, or an idle keep-alive) and has for `GRACE_TICKS` ticks of this worker's
event loop (a lagging loop ticks slower, so a request that arrived but is not parsed yet is never
taken for a trickle); never one whose request has arrived. A newcomer over a cap is held,
neither admitted nor closed: once its request has arrived it is admitted, for room a connection
without a request gives up (of the client holding the most, the longest waiting), or answered
503 with `Retry-After` (never a bare close). Probes (`PROBES`) are answered whatever the caps.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from gateway.errors import Overloaded, error_response
from gateway.listener.edge import REFUSAL
from gateway.metrics import Metrics
from gateway.policy.runtime import Identity

PROBES: Final = frozenset({"/healthz", "/readyz"})
TICK_S: Final = 0.05
GRACE_TICKS: Final = 10  # a connection's time to send its request before it may give way
MIN_OVERFLOW: Final = 4096  # connections held over the cap, at least (else: 4 x `limit`)
Identify = Callable[[web.BaseRequest], Identity | None]  # who the request's key is (None: no key)


@dataclass(frozen=True, slots=True)
class Identified:
    """Who a request's key is (None: it presented none), found once here and taken by
    authentication."""

    identity: Identity | None


IDENTIFIED = web.RequestKey("kvfence_identified", Identified)


@dataclass(slots=True)
class _Conn:
    peer: str  # the client's address
    party: str  # whom it counts against: `tenant:<id>` for its last request's tenant, else
    # `addr:<address>`
    since: float  # when it opened, or its last request ended
    tick: int  # the loop's tick then
    transport: asyncio.Transport
    admitted: bool  # False: held over a cap until its request arrives
    finished: int = 0  # requests answered on it


class Pressure:
    def __init__(
        self,
        limit: int,
        per_client: int,
        metrics: Metrics,
        identify: Identify | None = None,
    ) -> None:
        self.limit, self.per_client, self.metrics = limit, per_client, metrics
        self.overflow = max(4 * limit, MIN_OVERFLOW)
        self._identify = identify
        self.tick = 0
        self._ticker: asyncio.TimerHandle | None = None
        self._conns: dict[RequestHandler, _Conn] = {}
        self._waiting: dict[RequestHandler, _Conn] = {}  # no request seen in progress: victims
        self._parties = Counter[str]()  # admitted connections per party
        self.admitted = 0
        self.held = 0

    @property
    def busy(self) -> bool:
        """Every connection slot is taken, or a newcomer waits for one."""
        return self.admitted >= self.limit or self.held > 0

    def _tick(self) -> None:
        self.tick += 1
        self._ticker = asyncio.get_running_loop().call_later(TICK_S, self._tick)

    def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()

    def install(self, server: web.Server) -> None:
        """Call in the serving loop; `close` when it stops."""
        made, lost, handle = server.connection_made, server.connection_lost, server.request_handler
        self._tick()

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._open(handler, transport)

        def connection_lost(handler: RequestHandler, exc: BaseException | None) -> None:
            lost(handler, exc)
            self._forget(handler)

        async def request_handler(request: web.BaseRequest) -> web.StreamResponse:
            handler = request.protocol
            conn = self._conns.get(handler)
            self._waiting.pop(handler, None)
            if conn is not None and not _exempt(request):
                refused = self._seat(conn, request)
                if refused is not None:
                    self.metrics.child(self.metrics.connections_refused, refused).inc()
                    return _overloaded()
            try:
                return await handle(request)
            finally:
                if conn is not None:
                    conn.finished += 1
                    conn.since, conn.tick = time.monotonic(), self.tick
                    if handler in self._conns:
                        self._waiting[handler] = conn

        setattr(server, "connection_made", connection_made)  # noqa: B010
        setattr(server, "connection_lost", connection_lost)  # noqa: B010
        server.request_handler = request_handler

    def _open(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        peer = str((transport.get_extra_info("peername") or ("?",))[0])
        party = "addr:" + peer
        fits = self.admitted < self.limit and self._parties[party] < self.per_client
        conn = _Conn(peer, party, time.monotonic(), self.tick, transport, fits)
        self._conns[handler] = self._waiting[handler] = conn
        if fits:
            self._count(conn, 1)
            return
        self.held += 1
        if self.held > self.overflow:  # the oldest held connection without a request goes
            self._close_one(self._victim(held=True))

    def _seat(self, conn: _Conn, request: web.BaseRequest) -> str | None:
        """A request arrived on `conn`: count it against its tenant (else its address) and admit
        a held connection; None when it may run, else the cap that refuses it (`total` or
        `per_client`)."""
        identity = self._identify(request) if self._identify is not None else None
        request[IDENTIFIED] = Identified(identity)
        tenant = identity.tenant if identity is not None else None
        party = "addr:" + conn.peer if tenant is None else "tenant:" + tenant.id
        if conn.admitted:
            if party != conn.party:
                self._count(conn, -1)
                conn.party = party
                self._count(conn, 1)
                if self._parties[party] > self.per_client and not self._close_one(
                    self._victim(held=False, party=party)
                ):
                    return "per_client"
            return None
        conn.party = party
        own = self._parties[party] >= self.per_client
        if (own or self.admitted >= self.limit) and not self._close_one(
            self._victim(held=False, party=party if own else None)
        ):
            return "per_client" if own else "total"
        self.held -= 1
        conn.admitted = True
        self._count(conn, 1)
        return None

    def _victim(self, held: bool, party: str | None = None) -> RequestHandler | None:
        """The connection to give way: without a request past its grace, admitted (or held),
        of `party` if given, else of the party holding the most; the longest waiting."""
        old = self.tick - GRACE_TICKS
        found = [(-self._parties[c.party], c.since, h) for h, c in self._waiting.items()
                 if c.admitted is not held and c.tick <= old and not _busy(h, c)
                 and party in (None, c.party)]  # fmt: skip
        return min(found, key=lambda item: item[:2])[2] if found else None

    def _close_one(self, handler: RequestHandler | None) -> bool:
        """Close `handler`'s connection for room; False when there is none to close."""
        if handler is None:
            return False
        conn = self._conns[handler]
        self._forget(handler)
        handler.force_close()
        conn.transport.close()
        self.metrics.connections_reclaimed.inc()
        return True

    def _count(self, conn: _Conn, step: int) -> None:
        self.admitted += step
        self._parties[conn.party] += step
        if not self._parties[conn.party]:
            del self._parties[conn.party]

    def _forget(self, handler: RequestHandler) -> None:
        self._waiting.pop(handler, None)
        conn = self._conns.pop(handler, None)
        if conn is None:
            return
        if conn.admitted:
            self._count(conn, -1)
        else:
            self.held -= 1


def _busy(handler: RequestHandler, conn: _Conn) -> bool:
    """A request was parsed on it and is not answered yet. aiohttp counts parsed requests as
    they arrive, in the transport's callback, before the request is even scheduled."""
    return int(getattr(handler, "_request_count", 0)) > conn.finished


def _exempt(request: web.BaseRequest) -> bool:
    """Answered on a held connection without room: a probe, or a request the edge refuses
    (answered and closed)."""
    return (request.method == "GET" and request.path in PROBES) or REFUSAL in request


def _overloaded() -> web.Response:
    error = Overloaded("the gateway holds as many connections as it may; retry shortly", 1.0)
    return error_response(error, close=True)  # closes once the answer is out


PRESSURE = web.AppKey("kvfence_pressure", Pressure)
