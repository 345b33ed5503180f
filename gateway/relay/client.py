"""The relay's own HTTP/1.1 client for the upstream call: keep-alive connections pooled per
origin, each request written at once, each answer parsed by llhttp (httptools) as it arrives and
read chunk by chunk. Health checks, canaries and model lists keep the app's aiohttp session.

Invariant: a connection goes back to its pool only when its answer was read to its end and the
backend keeps it alive; any other end (an error, a cancelled wait, an answer left unread)
closes it. A request is sent once: a failure is the caller's to retry. Failures are
aiohttp's `ClientError`s, named by `gateway.relay.failures.describe`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, cast

import aiohttp
import httptools
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

KEEPALIVE_S: Final = 4.0  # under the 5 s a uvicorn server (vLLM, SGLang) keeps an idle connection
MAX_IDLE: Final = 256  # idle connections kept per origin
HIGH_WATER: Final = 256 * 1024  # unread answer bytes at which the connection stops reading
_NO_BODY: Final = frozenset({204, 304})


class ConnectFailed(aiohttp.ClientConnectionError):
    """No connection to the backend could be made; `os_error` says why."""

    def __init__(self, os_error: OSError) -> None:
        super().__init__(str(os_error))
        self.os_error = os_error


class MalformedAnswer(aiohttp.ClientError):
    """The backend's bytes are not an HTTP/1.1 answer."""


@dataclass(frozen=True, slots=True)
class _Target:
    """Where one upstream URL's requests go, and the first lines of each, encoded once."""

    origin: tuple[str, int, bool]  # host, port, TLS
    head: bytes  # the request line and Host


def _target(url: URL) -> _Target:
    tls = url.scheme == "https"
    host, port = url.raw_host or "", url.port or (443 if tls else 80)
    authority = f"[{host}]" if ":" in host else host
    if port != (443 if tls else 80):
        authority += f":{port}"
    head = f"POST {url.raw_path_qs} HTTP/1.1\r\nhost: {authority}\r\n"
    if url.user is not None:  # credentials in the backend's URL, as aiohttp sent them
        head += f"authorization: {aiohttp.encode_basic_auth(url.user, url.password or '')}\r\n"
    return _Target((host, port, tls), head.encode())


def _header_block(headers: Mapping[str, str], size: int) -> bytes:
    lines = [f"content-length: {size}\r\n"]
    for name, value in headers.items():
        if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
            raise ValueError(f"header {name!r}: a line break or colon cannot be sent")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    return "".join(lines).encode()


class Answer:
    """One upstream answer: its status and headers, then its body as it arrives (`readany`)."""

    __slots__ = ("_buffered", "_chunks", "_conn", "_ended", "_error", "_released", "_waiter",
                 "content_type", "headers", "status")  # fmt: skip

    def __init__(self, conn: _Connection, status: int, headers: CIMultiDictProxy[str]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        value = headers.get("content-type", "application/octet-stream")
        self.content_type = value.partition(";")[0].strip().lower()
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._ended = False  # the body was read to its end by the parser
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._released = False

    async def readany(self) -> bytes:
        """What arrived since the last read; b"" once the body has ended."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self._ended:
                return b""
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self._chunks = self._chunks, []
        if self._buffered >= HIGH_WATER:
            self._conn.resume()
        self._buffered = 0
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self) -> None:
        """Done with this answer: its connection is pooled again if it may be, else closed.
        Only the first call counts: a second must never pool a connection another request has
        taken since (two requests on one connection would get each other's answers)."""
        if self._released:
            return
        self._released = True
        self._conn.done(self._ended and self._error is None and not self._chunks)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered >= HIGH_WATER:
            self._conn.pause()
        self._wake()

    def _end(self, error: BaseException | None = None) -> None:
        if error is None:
            self._ended = True
        elif not self._ended:
            self._error = error
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Connection(asyncio.Protocol):
    """One keep-alive connection and its parser; answers one request at a time."""

    def __init__(self, pool: deque[_Connection]) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._head: asyncio.Future[Answer] | None = None  # the answer's headers, awaited
        self._answer: Answer | None = None
        self._names: list[tuple[str, str]] = []
        self._framed = False  # a length or chunks end the body (else the connection's end does)
        self._informational = False  # a 1xx head: its end is not the answer's
        self._keep = False  # the backend keeps the connection after the answer that ended
        self.closed = False
        self.idle_since = 0.0

    def send(self, data: bytes) -> asyncio.Future[Answer]:
        assert self._transport is not None
        self._head = asyncio.get_running_loop().create_future()
        self._transport.write(data)
        return self._head

    def pause(self) -> None:
        if self._transport is not None:
            self._transport.pause_reading()

    def resume(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.resume_reading()

    def done(self, reusable: bool) -> None:
        self._head, self._answer = None, None
        keep = reusable and self._keep and not self.closed
        if keep and len(self._pool) < MAX_IDLE:
            self.idle_since = asyncio.get_running_loop().time()
            self._pool.append(self)
            return
        self.close()

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not asyncio's class

    def data_received(self, data: bytes) -> None:
        if self._head is None:  # bytes while idle: nothing asked for them
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(MalformedAnswer(f"malformed answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._answer is not None:
            if self._framed or exc is not None:
                self._answer._end(aiohttp.ClientPayloadError("answer cut short"))
            else:
                self._answer._end()  # a body without a length ends with its connection
        elif self._head is not None and not self._head.done():
            self._head.set_exception(aiohttp.ServerDisconnectedError())

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._answer is not None:  # a second answer to one request: the parser stops here
            raise MalformedAnswer("more than one answer to one request")
        self._names, self._framed, self._informational, self._keep = [], False, False, False

    def on_header(self, name: bytes, value: bytes) -> None:
        text = name.decode("latin-1")
        lowered = text.lower()
        if lowered == "content-length" or lowered == "transfer-encoding":
            self._framed = True
        self._names.append((text, value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if status < 200:  # 100 Continue, 103 Early Hints: the answer follows
            self._informational = True
            return
        if status in _NO_BODY:
            self._framed = True
        answer = Answer(self, status, CIMultiDictProxy(CIMultiDict(self._names)))
        self._answer = answer
        if self._head is not None and not self._head.done():
            self._head.set_result(answer)

    def on_body(self, body: bytes) -> None:
        if self._answer is not None:
            self._answer._feed(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self._keep = self._parser.should_keep_alive()  # llhttp says so only here
        if self._answer is not None:
            self._answer._end()

    def _fail(self, error: BaseException) -> None:
        if self._answer is not None:
            self._answer._end(error)
        elif self._head is not None and not self._head.done():
            self._head.set_exception(error)


class UpstreamClient:
    """Pooled connections per origin; `post` sends a request and returns its answer's head."""

    def __init__(self) -> None:
        self._targets: dict[URL, _Target] = {}
        self._pools: dict[tuple[str, int, bool], deque[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(
        self, url: URL, data: bytes, headers: dict[str, str], connect_s: float
    ) -> Answer:
        """Send `data` to `url`; the answer once its headers arrived (the caller limits that
        wait, and must `release` the answer). Connecting is limited to `connect_s`."""
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = _target(url)
        message = b"".join((target.head, _header_block(headers, len(data)), data))
        conn = self._idle(target.origin) or await self._connect(target.origin, connect_s)
        try:
            return await conn.send(message)
        except BaseException:
            conn.close()
            raise

    def _idle(self, origin: tuple[str, int, bool]) -> _Connection | None:
        pool = self._pools.get(origin)
        if not pool:
            return None
        oldest = asyncio.get_running_loop().time() - KEEPALIVE_S
        while pool:
            conn = pool.pop()
            if not conn.closed and conn.idle_since > oldest:
                return conn
            conn.close()
        return None

    async def _connect(self, origin: tuple[str, int, bool], connect_s: float) -> _Connection:
        host, port, tls = origin
        pool = self._pools.setdefault(origin, deque())
        loop = asyncio.get_running_loop()
        context = None
        if tls:
            context = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(pool), host, port, ssl=context
                )
        except TimeoutError:
            raise aiohttp.ConnectionTimeoutError(f"connect to {host}:{port} timed out") from None
        except OSError as exc:
            raise ConnectFailed(exc) from None
        return conn

    def close(self) -> None:
        """Close every idle connection (those in use close as their answers are released)."""
        for pool in self._pools.values():
            while pool:
                pool.pop().close()
