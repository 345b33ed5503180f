"""A fake upstream at a GPU's token rate: it answers each streamed chat request with `--tokens`
chat chunks spaced `--gap-ms` apart (one HTTP chunk each), then the finishing chunk, the usage
event when `include_usage` was asked, and `[DONE]`. Each token event carries `"sent_ns"`, the
CLOCK_MONOTONIC nanoseconds of its write, so a client on the same host can time each event.
Raw asyncio HTTP/1.1, so its own cost per event stays small. A plain request gets a fixed
completion. Run: python -m bench.gateway.paced_upstream --tokens 200 --gap-ms 10 (prints
`PORT <n>` once listening).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Final

from bench.gateway.upstream import COMPLETION, Framed

_HEAD: Final = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_BASE: Final = (
    b'"id":"chatcmpl-paced","object":"chat.completion.chunk","created":1,"model":"smollm2"'
)
# A vLLM-shaped token chunk; the stamp closes it.
_TOKEN: Final = (
    b"data: {" + _BASE + b',"choices":[{"index":0,"delta":{"content":" token"},'
    b'"logprobs":null,"finish_reason":null}],"sent_ns":'
)
_FINISH: Final = (
    b"data: {" + _BASE + b',"choices":[{"index":0,"delta":{},"logprobs":null,'
    b'"finish_reason":"stop"}]}\n\n'
)
_DONE: Final = b"data: [DONE]\n\n"


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _usage(tokens: int) -> bytes:
    usage = (
        f'"usage":{{"prompt_tokens":12,"completion_tokens":{tokens},'
        f'"total_tokens":{12 + tokens},"prompt_tokens_details":{{"cached_tokens":0}}}}'
    )
    return b"data: {" + _BASE + b',"choices":[],' + usage.encode() + b"}\n\n"


class PacedProtocol(Framed):
    """One keep-alive connection, one request at a time: its stream's events on a fixed
    schedule from the request's arrival (event k at arrival + k * gap), late or not."""

    def __init__(self, tokens: int, gap_s: float) -> None:
        super().__init__()
        self._tokens, self._gap_s = tokens, gap_s
        self._loop = asyncio.get_running_loop()
        self._start = 0.0
        self._sent = 0
        self._ending = b""

    def _answer(self, request: bytes) -> None:
        assert self._transport is not None
        if b'"stream":true' not in request:
            self._transport.write(COMPLETION)
            return
        usage = _usage(self._tokens) if b'"include_usage":true' in request else b""
        self._ending = _chunked(_FINISH) + (_chunked(usage) if usage else b"")
        self._ending += _chunked(_DONE) + b"0\r\n\r\n"
        self._transport.write(_HEAD)
        self._start, self._sent = self._loop.time(), 0
        self._next()

    def _next(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._sent == self._tokens:
            transport.write(self._ending)
            return
        event = _TOKEN + str(time.monotonic_ns()).encode() + b"}\n\n"
        transport.write(_chunked(event))
        self._sent += 1
        at = self._start + self._sent * self._gap_s
        self._loop.call_at(at, self._next)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(host: str, port: int, tokens: int, gap_s: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: PacedProtocol(tokens, gap_s), host, port, backlog=1024
    )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=200, help="token events per stream")
    parser.add_argument("--gap-ms", type=float, default=10.0, help="between a stream's tokens")
    args = parser.parse_args(argv)
    import uvloop

    try:
        uvloop.run(serve(args.host, args.port, args.tokens, args.gap_ms / 1000))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
