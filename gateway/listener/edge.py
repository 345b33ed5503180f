"""The tenant listener's edge: what it cannot frame unambiguously is refused before routing, the
connection is closed, and nothing after it on that connection is ever parsed as a request.

Invariant: only GET and POST, HTTP/1.0 and 1.1, an origin-form target, one valid `Host` (none
only on 1.0), `Transfer-Encoding: chunked` alone and only on 1.1, and no `Upgrade` reach the
app; every refusal and every request aiohttp's parser rejects is counted by reason and logged
at most once per reason per second, at info level, with no byte of the request in the line.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.http import HttpVersion10, HttpVersion11, RawRequestMessage
from aiohttp.http_exceptions import HttpProcessingError

from gateway.errors import (
    MalformedRequest,
    MethodNotAllowed,
    VersionNotSupported,
    error_response,
)
from gateway.metrics import Metrics

EdgeError = MalformedRequest | MethodNotAllowed | VersionNotSupported
METHODS: Final = frozenset({"GET", "POST"})
VERSIONS: Final = frozenset({HttpVersion10, HttpVersion11})
# An RFC 3986 host (a reg-name of letters, digits, `.`, `_`, `-`, or a bracketed IPv6 literal)
# and an optional port: no userinfo, no space, no path.
_HOST_RE: Final = re.compile(r"^(?:[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?$")
REFUSAL: Final = web.RequestKey("kvfence_edge_refusal", object)
log = logging.getLogger("kvfence.gateway.edge")


def examine(message: RawRequestMessage) -> EdgeError | None:
    """Why this parsed request line and header block cannot be served, or None."""
    if message.method not in METHODS:
        return MethodNotAllowed(
            f"method {message.method[:16]} is not served; use GET or POST", METHODS
        )
    if message.version not in VERSIONS:
        return VersionNotSupported("only HTTP/1.0 and HTTP/1.1 are served")
    if not message.path.startswith("/") or message.path.startswith("//"):
        return MalformedRequest("the request target must be a path (origin-form)", "target")
    headers = message.headers
    hosts = headers.getall("Host", [])
    if len(hosts) > 1 or (not hosts and message.version != HttpVersion10):
        return MalformedRequest("exactly one Host header is required", "host")
    if hosts and not _HOST_RE.fullmatch(hosts[0]):
        return MalformedRequest("the Host header is not a valid host[:port]", "host")
    codings = headers.getall("Transfer-Encoding", [])
    if codings and message.version == HttpVersion10:
        return MalformedRequest("Transfer-Encoding is not allowed on HTTP/1.0", "transfer_encoding")
    if codings and [c.strip().lower() for c in codings] != ["chunked"]:
        return MalformedRequest("the only transfer coding served is chunked", "transfer_encoding")
    if "Upgrade" in headers or message.upgrade:
        return MalformedRequest("protocol upgrades are not served", "upgrade")
    return None


class RateLimitedLog:
    """At most one line per reason per `interval_s`; the next line says how many were dropped."""

    def __init__(self, interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self._interval, self._clock = interval_s, clock
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def info(self, reason: str, message: str) -> bool:
        """Log `message` for `reason` unless one was logged within the interval; True if so."""
        now = self._clock()
        last = self._last.get(reason)
        if last is not None and now - last < self._interval:
            self._dropped[reason] = self._dropped.get(reason, 0) + 1
            return False
        self._last[reason] = now
        log.info(message, extra={"reason": reason, "suppressed": self._dropped.pop(reason, 0)})
        return True


def parse_reason(exc: BaseException) -> str:
    """A bounded label for a parser rejection: aiohttp's exception class in snake case."""
    name = type(exc).__name__ if isinstance(exc, HttpProcessingError) else "ParseError"
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Edge:
    """Counts and logs what the edge refuses (one per app: its metrics)."""

    def __init__(self, metrics: Metrics, lines: RateLimitedLog | None = None) -> None:
        self.metrics = metrics
        self.lines = lines or RateLimitedLog()

    def refused(self, reason: str) -> None:
        self.metrics.child(self.metrics.malformed, reason).inc()
        self.lines.info(reason, "malformed request refused")


EDGE = web.AppKey("kvfence_edge", Edge)


class ServerLog(logging.Logger):
    """The logger aiohttp's HTTP server writes to. A request its parser rejects is client
    garbage: counted and logged as an edge refusal (never at error level, and never with the
    parser's message, which quotes the request's bytes and so may quote a key). Every other
    line reaches `aiohttp.server`'s handlers as before, at its own level."""

    def __init__(self, edge: Edge) -> None:
        super().__init__("aiohttp.server")
        self._edge = edge
        self._target = self.parent = logging.getLogger("aiohttp.server")

    def isEnabledFor(self, level: int) -> bool:
        return True  # every parser rejection is counted, whatever the level; `handle` filters

    def handle(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            self._edge.refused(parse_reason(exc))
        elif self._target.isEnabledFor(record.levelno):
            super().handle(record)


def refusal_response(error: EdgeError) -> web.Response:
    """The answer to a refused request; the connection closes after it, so the bytes pipelined
    after it are never parsed as a request."""
    return error_response(error, os.urandom(16).hex(), close=True)


def guard(server: web.Server, edge: Edge) -> None:
    """Examine every request before the app sees it, routing included. The check runs in the
    request factory, on the parsed message, so a refusal is answered in HTTP/1.1 whatever
    version the request named."""
    make_request, handler = server.request_factory, server.request_handler

    def request_factory(message: RawRequestMessage, *rest: Any) -> web.BaseRequest:
        # UNKNOWN is aiohttp's placeholder for a request its parser rejected (answered by it).
        refusal = examine(message) if message.method != "UNKNOWN" else None
        if refusal is not None and message.version not in VERSIONS:
            message = message._replace(version=HttpVersion11)
        request = make_request(message, *rest)
        if refusal is not None:
            request[REFUSAL] = refusal
        return request

    async def request_handler(request: web.BaseRequest) -> web.StreamResponse:
        refusal = request.get(REFUSAL)
        if not isinstance(refusal, EdgeError):
            return await handler(request)
        edge.refused(refusal.reason)
        return refusal_response(refusal)

    server.request_factory = request_factory
    server.request_handler = request_handler
