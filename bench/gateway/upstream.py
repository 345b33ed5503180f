"""A fake OpenAI-compatible upstream for the overhead benchmark: raw asyncio HTTP/1.1, so its own
cost per request stays small next to the gateway's.

It answers every POST with a fixed chat completion, or with a short SSE stream (chunked, one
write per event) when the body asks for `"stream":true`. Run:
python -m bench.gateway.upstream --port 0  (prints `PORT <n>` once listening)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Final, cast

import orjson

_HEAD_END: Final = b"\r\n\r\n"
_USAGE: Final = {
    "prompt_tokens": 12,
    "completion_tokens": 3,
    "total_tokens": 15,
    "prompt_tokens_details": {"cached_tokens": 0},
}


def _completion() -> bytes:
    body = orjson.dumps(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": "smollm2",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Hello there!"},
                    "finish_reason": "stop",
                }
            ],
            "usage": _USAGE,
        }
    )
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + _HEAD_END
    )
    return head + body


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(payload: object) -> bytes:
    return _chunked(b"data: " + orjson.dumps(payload) + b"\n\n")


def _stream_events(include_usage: bool) -> list[bytes]:
    """Head, one chunk per word, the usage event if asked, `[DONE]`, the chunked terminator."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1}
    events = [
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    ]
    for word in ("Hello", " there", "!", ""):
        delta = {"content": word} if word else {}
        reason = None if word else "stop"
        choice = {"index": 0, "delta": delta, "finish_reason": reason}
        chunk: dict[str, object] = {**base, "model": "smollm2", "choices": [choice]}
        if include_usage:
            chunk["usage"] = None
        events.append(_event(chunk))
    if include_usage:
        events.append(_event({**base, "model": "smollm2", "choices": [], "usage": _USAGE}))
    events.append(_chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return events


def _response_body() -> bytes:
    """A `/v1/responses` answer (the body alone) with the same text and usage."""
    usage = {
        "input_tokens": _USAGE["prompt_tokens"],
        "output_tokens": _USAGE["completion_tokens"],
        "total_tokens": _USAGE["total_tokens"],
        "input_tokens_details": _USAGE["prompt_tokens_details"],
    }
    text = {"type": "output_text", "text": "Hello there!"}
    message = {"type": "message", "role": "assistant", "content": [text]}
    doc = {"id": "resp-fake", "object": "response", "status": "completed", "model": "smollm2"}
    return orjson.dumps({**doc, "output": [message], "usage": usage})


COMPLETION: Final = _completion()
RESPONSE_BODY: Final = _response_body()
STREAM: Final = _stream_events(include_usage=False)
STREAM_USAGE: Final = _stream_events(include_usage=True)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


class Framed(asyncio.Protocol):
    """One keep-alive connection: each request's head parsed, its body waited for, then the
    whole request handed to `_answer`, one at a time."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = -1  # bytes of head + body once the head is parsed
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self._buf += data
        while True:
            if self._need < 0:
                end = self._buf.find(_HEAD_END)
                if end < 0:
                    return
                self._need = end + 4 + _content_length(bytes(self._buf[:end]))
            if len(self._buf) < self._need:
                return
            request = bytes(self._buf[: self._need])
            del self._buf[: self._need]
            self._need = -1
            self._answer(request)

    def _answer(self, request: bytes) -> None:
        raise NotImplementedError


class UpstreamProtocol(Framed):
    """Fixed answers: a small JSON completion, a short SSE stream, a Responses answer."""

    def _answer(self, request: bytes) -> None:
        assert self._transport is not None
        # Only the tail is searched: the flags sit after the messages in every body we send.
        tail = request[-512:]
        if b'"stream":true' not in tail:
            self._transport.write(COMPLETION)
            return
        events = STREAM_USAGE if b'"include_usage":true' in tail else STREAM
        self._write_from(events, 0)

    def _write_from(self, events: list[bytes], i: int) -> None:
        # One event per loop iteration, so a relay sees them as separate reads when it can.
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(events[i])
        if i + 1 < len(events):
            asyncio.get_running_loop().call_soon(self._write_from, events, i + 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None


async def serve(host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(UpstreamProtocol, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    print(f"PORT {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    import uvloop

    try:
        uvloop.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
