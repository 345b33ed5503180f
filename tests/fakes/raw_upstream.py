"""A fake upstream at the socket level (asyncio streams, port 0), for failures an aiohttp app
cannot produce: a reset before the headers, a stall, an answer that is not HTTP, a plain body
cut short of its Content-Length, a close-delimited stream cut mid-way."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

MODES = ("reset", "stall", "not_http", "short_body", "unframed_cut")


@dataclass
class RawUpstream:
    mode: str
    requests: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def close(self) -> None:
        self._stop.set()  # a stalled handler ends rather than being cancelled mid-await
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET "):  # the gateway's health check: healthy
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                await writer.drain()
                writer.close()
                return
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            self.requests += 1
            if self.mode == "reset":
                writer.transport.abort()
                return
            if self.mode == "stall":
                await self._stop.wait()
            if self.mode == "not_http":
                writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")
            elif self.mode == "short_body":
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n{\"choices\": [")  # fmt: skip
            elif self.mode == "unframed_cut":
                event = b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                             b"Connection: close\r\n\r\n" + event)  # fmt: skip
            await writer.drain()
        writer.close()
