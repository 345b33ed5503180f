"""An open-loop HTTP/1.1 load generator on raw asyncio connections.

Invariant: request i is due at start + i/rate whatever happened to earlier ones; a request that
finds no idle connection waits in a queue, and that wait counts in its `due` latency.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, cast

_HEAD_END: Final = b"\r\n\r\n"


@dataclass(frozen=True, slots=True)
class Job:
    request: bytes  # the whole HTTP request, head and body
    marker: bytes  # a successful answer's body contains this


@dataclass(slots=True)
class Tally:
    """What one run saw, for the requests due after the warm-up."""

    sent_ms: list[float] = field(default_factory=list)  # from the write to the last byte
    due_ms: list[float] = field(default_factory=list)  # from when it was due to the last byte
    errors: int = 0
    first_error: str = ""

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


class _Response:
    """Incremental parse of one answer (content-length or chunked); `body` once complete."""

    __slots__ = ("_chunks", "_head", "_length", "_pos", "body", "status")

    def __init__(self) -> None:
        self._head = -1
        self._length = -1  # -1: chunked
        self._pos = 0
        self._chunks: list[bytes] = []
        self.status = b""
        self.body: bytes | None = None

    def feed(self, buf: bytearray) -> int:
        """Consume what it can; returns the bytes used once complete, else 0."""
        if self._head < 0:
            end = buf.find(_HEAD_END)
            if end < 0:
                return 0
            head = bytes(buf[:end]).lower()
            self.status = head[9:12]
            self._head = self._pos = end + 4
            i = head.find(b"\r\ncontent-length:")
            if i >= 0:
                j = head.find(b"\r\n", i + 2)
                self._length = int(head[i + 17 : j if j >= 0 else len(head)])
        if self._length >= 0:
            if len(buf) < self._head + self._length:
                return 0
            self.body = bytes(buf[self._head : self._head + self._length])
            return self._head + self._length
        return self._feed_chunked(buf)

    def _feed_chunked(self, buf: bytearray) -> int:
        while True:
            eol = buf.find(b"\r\n", self._pos)
            if eol < 0:
                return 0
            size = int(buf[self._pos : eol].split(b";")[0], 16)
            end = eol + 2 + size + 2
            if len(buf) < end:
                return 0
            if size == 0:
                self.body = b"".join(self._chunks)
                return end
            self._chunks.append(bytes(buf[eol + 2 : eol + 2 + size]))
            self._pos = end


class _Connection(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._due = 0.0
        self._sent = 0.0
        self._measured = False
        self._response: _Response | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._pool.ready(self)

    def send(self, due: float, measured: bool) -> None:
        assert self._transport is not None
        self._due, self._measured, self._response = due, measured, _Response()
        self._sent = time.perf_counter()
        self._transport.write(self._pool.job.request)

    def data_received(self, data: bytes) -> None:
        self._buf += data
        response = self._response
        if response is None:
            return
        used = response.feed(self._buf)
        if not used:
            return
        done = time.perf_counter()
        del self._buf[:used]
        self._response = None
        if self._measured:
            self._pool.record(response, self._sent, self._due, done)
        self._pool.finish_one()
        self._pool.ready(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._pool.lost(self, self._response is not None, self._measured)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Pool:
    """Idle connections, a queue of due requests, and the tally of the measured ones."""

    def __init__(self, host: str, port: int, job: Job, max_connections: int) -> None:
        self.host, self.port, self.job = host, port, job
        self.tally = Tally()
        self.outstanding = 0
        self._max = max_connections
        self._all: set[_Connection] = set()
        self._idle: list[_Connection] = []
        self._queue: deque[tuple[float, bool]] = deque()
        self._opening = 0
        self._drained = asyncio.Event()

    async def open(self, count: int) -> None:
        await asyncio.gather(*(self._connect() for _ in range(count)))

    async def _connect(self) -> None:
        self._opening += 1
        try:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(lambda: _Connection(self), self.host, self.port)
            self._all.add(conn)
        except OSError as exc:
            self.tally.fail(f"connect: {exc}")
        finally:
            self._opening -= 1

    def submit(self, due: float, measured: bool) -> None:
        self.outstanding += 1
        self._drained.clear()
        if self._idle:
            self._idle.pop().send(due, measured)
            return
        self._queue.append((due, measured))
        if len(self._all) + self._opening < self._max:
            asyncio.get_running_loop().create_task(self._connect())

    def ready(self, conn: _Connection) -> None:
        """A connection is free: it takes the oldest queued request or goes idle."""
        if self._queue:
            conn.send(*self._queue.popleft())
        else:
            self._idle.append(conn)

    def finish_one(self) -> None:
        self.outstanding -= 1
        if not self.outstanding:
            self._drained.set()

    def record(self, response: _Response, sent: float, due: float, done: float) -> None:
        if response.status != b"200":
            self.tally.fail(f"status {response.status.decode()}")
        elif response.body is None or self.job.marker not in response.body:
            self.tally.fail("answer without the expected content")
        else:
            self.tally.sent_ms.append((done - sent) * 1000)
            self.tally.due_ms.append((done - due) * 1000)

    def lost(self, conn: _Connection, in_flight: bool, measured: bool) -> None:
        self._all.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
        if in_flight:
            if measured:
                self.tally.fail("connection lost mid-request")
            self.finish_one()

    async def drain(self, timeout_s: float) -> None:
        if self.outstanding:
            try:
                async with asyncio.timeout(timeout_s):
                    await self._drained.wait()
            except TimeoutError:
                for _ in range(self.outstanding):
                    self.tally.fail("no answer before the deadline")

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()


async def run_open_loop(
    pool: Pool,
    rate: float,
    duration_s: float,
    warmup_s: float,
    on_measure: Callable[[], None],
) -> float:
    """Send at `rate` for warm-up + duration; returns the measured window's wall seconds.
    `on_measure` runs when the first measured request is due and again after the drain."""
    total = int(rate * (warmup_s + duration_s))
    first = int(rate * warmup_s)
    start = time.perf_counter() + 0.02
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if i == first:
            on_measure()
        pool.submit(due, i >= first)
    measure_start = start + first / rate
    await pool.drain(timeout_s=10.0)
    on_measure()
    return time.perf_counter() - measure_start
