"""The benchmark's traffic: chat-completion requests, small or with a 200 KB prompt, streaming or
not, as ready-to-send HTTP/1.1 bytes.

Invariant: direct and gateway runs send byte-identical bodies and headers (bar `Host`).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from bench.gateway.procs import MODEL

LARGE_BYTES = 200_000


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    body: bytes
    stream: bool

    @property
    def marker(self) -> bytes:
        return b"data: [DONE]" if self.stream else b'"chat.completion"'


def _body(content: str, stream: bool) -> bytes:
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": content},
    ]
    return orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 16, "stream": stream})


def scenarios() -> dict[str, Scenario]:
    words = "lantern orbit meadow copper violet harbor signal tundra "
    large = (words * (LARGE_BYTES // len(words) + 1))[:LARGE_BYTES]
    small = "Say hello in three words."
    return {
        "small": Scenario("small", _body(small, False), False),
        "small-sse": Scenario("small-sse", _body(small, True), True),
        "200k": Scenario("200k", _body(large, False), False),
        "200k-sse": Scenario("200k-sse", _body(large, True), True),
    }


def request_bytes(port: int, key: str, body: bytes) -> bytes:
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body
