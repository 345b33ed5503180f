"""A client that keeps `streams` chat streams open at once on raw asyncio connections (a new one
starts on a connection as soon as its last one ended) and times every token event: its
receipt minus the `sent_ns` stamp the paced upstream wrote into it (CLOCK_MONOTONIC, one clock
for every process of the host), so the figure is the event's whole trip upstream -> relay ->
client, queueing included.

Invariant: only token events received inside the measured window count; an answer that is not
a 200 stream ending in `[DONE]` is an error, reported beside the figures, never timed.
"""

from __future__ import annotations

import asyncio
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, cast

_HEAD_END: Final = b"\r\n\r\n"
_STAMP: Final = b'"sent_ns":'
_DONE: Final = b"data: [DONE]"
_CHUNKED: Final = b"transfer-encoding: chunked"


@dataclass(slots=True)
class Tally:
    """What the window saw: each token event's latency (ns), streams ended, errors."""

    latency_ns: array[int] = field(default_factory=lambda: array("q"))
    streams: int = 0
    errors: int = 0
    first_error: str = ""

    def fail(self, why: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or why


class _Chunked:
    """Incremental decoding of a chunked body (no trailers): payload out, `done` at its end."""

    __slots__ = ("_buf", "_left", "done")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._left = 0  # payload bytes still due in this chunk; -1: its CRLF is due
        self.done = False

    def feed(self, data: bytes | bytearray) -> bytes:
        buf = self._buf
        buf += data
        out: list[bytes] = []
        pos = 0
        while not self.done:
            if self._left > 0:
                take = min(self._left, len(buf) - pos)
                out.append(bytes(buf[pos : pos + take]))
                pos += take
                self._left -= take
                if self._left:
                    break
                self._left = -1
            if self._left < 0:
                if len(buf) - pos < 2:
                    break
                pos, self._left = pos + 2, 0
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(buf[pos:eol].split(b";")[0], 16)
            if size == 0:
                self.done = len(buf) - eol >= 4  # the empty line after the last chunk
                pos = eol + 4 if self.done else pos
                break
            pos, self._left = eol + 2, size
        del buf[:pos]
        return b"".join(out)


class _Stream(asyncio.Protocol):
    """One connection carrying one stream at a time."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._transport: asyncio.Transport | None = None
        self._head = bytearray()
        self._body: _Chunked | None = None
        self._events = b""
        self._error = ""
        self._ended = False  # `[DONE]` came
        self._busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    @property
    def usable(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def start(self) -> None:
        assert self._transport is not None
        self._head, self._body, self._events = bytearray(), None, b""
        self._error, self._ended, self._busy = "", False, True
        self._transport.write(self._client.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        if self._body is None:
            self._head += data
            end = self._head.find(_HEAD_END)
            if end < 0:
                return
            status = bytes(self._head[9:12])
            if status != b"200" or _CHUNKED not in self._head[:end].lower():
                # a JSON answer (an error), not a stream: this connection is done
                self._finish(f"status {status.decode()}, not a chunked stream")
                self.close()
                return
            data, self._body = bytes(self._head[end + 4 :]), _Chunked()
        events = self._events + self._body.feed(data)
        cut = events.rfind(b"\n\n") + 2
        complete, self._events = events[:cut], events[cut:]
        self._client.seen(complete, now)
        if b"event: error" in complete:
            self._error = self._error or "an error event"
        elif _DONE in complete:
            self._ended = True
        if self._body.done and self._busy:
            self._finish(self._error or ("" if self._ended else "stream ended without [DONE]"))

    def _finish(self, error: str) -> None:
        self._busy = False
        self._client.ended(self, error)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._busy:
            self._finish("connection lost mid-stream")

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class Client:
    """`streams` connections to host:port, each streaming `request` again and again until
    `stop`; token events received between `measure` and `stop` are timed."""

    def __init__(self, host: str, port: int, request: bytes, streams: int) -> None:
        self.host, self.port, self.request, self.streams = host, port, request, streams
        self.tally = Tally()
        self._conns: list[_Stream] = []
        self._measuring = False
        self._running = True
        self._busy = 0
        self._idle = asyncio.Event()

    def seen(self, events: bytes, now_ns: int) -> None:
        if not self._measuring:
            return
        out, at = self.tally.latency_ns, events.find(_STAMP)
        while at >= 0:
            start = at + len(_STAMP)
            end = events.find(b"}", start)
            out.append(now_ns - int(events[start:end]))
            at = events.find(_STAMP, end)

    def ended(self, conn: _Stream, error: str) -> None:
        self._busy -= 1
        if self._measuring:
            if error:
                self.tally.fail(error)
            else:
                self.tally.streams += 1
        if self._running and conn.usable:
            self._busy += 1
            conn.start()
        elif not self._busy:
            self._idle.set()

    async def run(
        self, spread_s: float, warmup_s: float, measure_s: float, mark: Callable[[], None]
    ) -> float:
        """Open the connections, start their first streams spread over `spread_s`, measure
        from warm-up's end for `measure_s` (`mark` runs at both ends of the window); returns
        the window's length. Streams under way at its end run out before this returns."""
        loop = asyncio.get_running_loop()
        for _ in range(self.streams):
            _, conn = await loop.create_connection(lambda: _Stream(self), self.host, self.port)
            self._conns.append(conn)
        start = loop.time()
        for i, conn in enumerate(self._conns):
            loop.call_at(start + spread_s * i / self.streams, self._begin, conn)
        await asyncio.sleep(max(0.0, start + warmup_s - loop.time()))
        mark()
        self._measuring, opened = True, time.monotonic()
        await asyncio.sleep(measure_s)
        self._measuring, window = False, time.monotonic() - opened
        mark()
        self._running = False
        if self._busy:
            self._idle.clear()
            try:
                async with asyncio.timeout(spread_s + 10):
                    await self._idle.wait()
            except TimeoutError:
                self.tally.fail(f"{self._busy} streams still open after the run")
        for conn in self._conns:
            conn.close()
        return window

    def _begin(self, conn: _Stream) -> None:
        if self._running and conn.usable:
            self._busy += 1
            conn.start()
